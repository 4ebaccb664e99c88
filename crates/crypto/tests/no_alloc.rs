//! Checks that `SaCipher::seal_in_place` / `open_in_place` / `iv_from_counter` make no heap
//! allocation per call (docs/architecture.md, "Performance rules": no allocation per packet), with a counting global
//! allocator. This sees Rust allocations only; the aws-lc C paths used per call (EVP AEAD
//! seal/open, AES-CBC, `HMAC_CTX_copy_ex`, which is a memcpy) were reviewed to allocate nothing.

use protego_crypto::{Encr, Integ, SaCipher};
use std::{
    alloc::{GlobalAlloc, Layout, System},
    cell::Cell,
};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

fn count() {
    // `try_with`: the thread-local may be gone while a thread shuts down.
    let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: forwards to the system allocator unchanged; only counts calls.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn allocations_during(f: impl FnOnce()) -> usize {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn per_packet_operations_do_not_allocate() {
    // The counter works (the assertion below is not vacuous).
    assert!(allocations_during(|| drop(std::hint::black_box(vec![1u8; 10]))) >= 1);

    let ciphers = [
        SaCipher::new(Encr::AesGcm16_128, &[1; 20], None),
        SaCipher::new(Encr::AesGcm16_256, &[1; 36], None),
        SaCipher::new(Encr::ChaCha20Poly1305, &[1; 36], None),
        SaCipher::new(
            Encr::AesCbc128,
            &[1; 16],
            Some((Integ::HmacSha1_96, &[2; 20])),
        ),
        SaCipher::new(
            Encr::AesCbc256,
            &[1; 32],
            Some((Integ::HmacSha512_256, &[2; 64])),
        ),
    ];
    let mut packet = [0x5a_u8; 1408]; // a whole number of AES blocks
    let mut iv = [0u8; 16];
    let mut icv = [0u8; 32];
    for cipher in ciphers {
        let cipher = cipher.expect("valid keys");
        let (iv_len, icv_len) = (cipher.iv_len(), cipher.icv_len());
        let n = allocations_during(|| {
            for seq in 1..=64_u64 {
                cipher.iv_from_counter(seq, &mut iv);
                let (iv, icv) = (&iv[..iv_len], &mut icv[..icv_len]);
                let aad = seq.to_be_bytes();
                cipher
                    .seal_in_place(iv, &aad, &mut packet, icv)
                    .expect("seal");
                cipher
                    .open_in_place(iv, &aad, &mut packet, icv)
                    .expect("open");
                // A forged packet is rejected without allocating either.
                icv[0] ^= 1;
                assert!(cipher.open_in_place(iv, &aad, &mut packet, icv).is_err());
            }
        });
        assert_eq!(
            n,
            0,
            "{:?} allocated {n} times in 64 packets",
            cipher.encr()
        );
    }
}
