//! Model-checked interleavings of the replay window (loom explores every schedule of the
//! atomics and the advance mutex). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p protego-esp --release --lib loom`.
//!
//! The window has W = 32 and two ring words (blocks 0-63 and 128-191 share word 0), so a
//! small number of operations reaches every case: duplicates racing, an advance recycling
//! the word a duplicate is setting, two advances racing, and a number behind the top racing
//! an advance that recycles its word. The distances `update` reports (how far behind the top
//! a number was accepted) are checked too.

use super::*;
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(4);
    b.check(f);
}

#[test]
fn loom_duplicates_race() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        w.update(10).unwrap();
        let w2 = Arc::clone(&w);
        let t = thread::spawn(move || w2.update(20).is_ok());
        let mine = w.update(20).is_ok();
        let theirs = t.join().unwrap();
        assert!(mine ^ theirs, "exactly one of two copies is accepted");
        assert!(w.update(20).is_err());
    });
}

#[test]
fn loom_advance_recycles_word_of_accepted_number() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        // 40 is accepted; its word (block 0) is recycled for block 2 by the advance to 130.
        w.update(40).unwrap();
        let w2 = Arc::clone(&w);
        let t = thread::spawn(move || w2.update(130).is_ok());
        let replay = w.update(40);
        assert!(t.join().unwrap());
        assert!(replay.is_err(), "40 accepted twice: {replay:?}");
        assert!(w.update(40).is_err());
        assert!(w.update(130).is_err());
    });
}

#[test]
fn loom_racing_advances_and_in_window_number() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        w.update(60).unwrap();
        let (a, b) = (Arc::clone(&w), Arc::clone(&w));
        let ta = thread::spawn(move || a.update(70).is_ok());
        let tb = thread::spawn(move || b.update(129).is_ok());
        let late = w.update(61).is_ok();
        let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
        assert!(rb, "the highest number is always accepted");
        // 70 and 61 may legitimately be too old by the time they run, but never twice.
        for (s, first) in [(70, ra), (61, late), (129, rb), (60, true)] {
            let again = w.update(s);
            assert!(again.is_err(), "{s} accepted again after first={first}");
        }
    });
}

#[test]
fn loom_duplicates_racing_an_advance() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        w.update(40).unwrap();
        let (a, c) = (Arc::clone(&w), Arc::clone(&w));
        let ta = thread::spawn(move || a.update(50).is_ok());
        let tc = thread::spawn(move || c.update(100).is_ok());
        let mine = w.update(50).is_ok();
        let theirs = ta.join().unwrap();
        assert!(tc.join().unwrap());
        assert!(!(mine && theirs), "50 accepted twice");
        // Window is now 69..=100: 50 is too old whatever happened.
        assert!(w.update(50).is_err());
        assert!(w.update(100).is_err());
    });
}

#[test]
fn loom_reorder_distance() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        w.update(10).unwrap();
        let w2 = Arc::clone(&w);
        let t = thread::spawn(move || w2.update(13));
        let mine = w.update(12);
        let theirs = t.join().unwrap();
        // 13 is the highest: accepted in order; 12 before 13 (0) or behind it (1).
        assert_eq!(theirs, Ok(0));
        assert!(matches!(mine, Ok(0) | Ok(1)), "{mine:?}");
        assert_eq!(w.top(), 13);
        assert_eq!(w.update(11), Ok(2));
    });
}

#[test]
fn loom_behind_top_racing_a_recycling_advance() {
    model(|| {
        let w = Arc::new(ReplayWindow::new(32));
        w.update(60).unwrap();
        let w2 = Arc::clone(&w);
        // 130 recycles word 0 (block 0) for block 2; 45 (block 0, below top 60) is accepted
        // before that or refused.
        let t = thread::spawn(move || w2.update(130));
        let late = w.update(45);
        assert_eq!(t.join().unwrap(), Ok(0));
        match late {
            Ok(behind) => assert_eq!(behind, 15),
            Err(e) => assert!(matches!(e, ReplayError::TooOld { .. }), "{e:?}"),
        }
        assert_eq!(w.top(), 130);
        assert!(
            w.update(45).is_err(),
            "45 accepted twice or after it fell out"
        );
        assert!(w.update(130).is_err());
    });
}
