//! Test helpers shared by the modules' tests.

/// Runs `test` on a thread in a network namespace of its own holding a veth pair `v0`-`v1`
/// (both up, MTU `mtu`); returns without running it where namespaces cannot be made and the
/// suite is not strict (`testreq`).
pub(crate) fn in_veth_namespace(mtu: u32, test: impl FnOnce() + Send + 'static) {
    let run = move || {
        // SAFETY: plain system call; affects this thread only.
        if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
            let e = std::io::Error::last_os_error();
            assert!(!testreq::netns_refused(&testreq::this_test(), &e));
            return;
        }
        let mtu = mtu.to_string();
        for args in [
            &["link", "add", "v0", "type", "veth", "peer", "name", "v1"][..],
            &["link", "set", "v0", "mtu", &mtu, "up"],
            &["link", "set", "v1", "mtu", &mtu, "up"],
        ] {
            ip(args);
        }
        test();
    };
    std::thread::spawn(run)
        .join()
        .expect("in its own namespace");
}

/// Runs `ip args` in this thread's namespace; panics if it fails.
pub(crate) fn ip(args: &[&str]) {
    let st = std::process::Command::new("ip")
        .args(args)
        .status()
        .expect("ip");
    assert!(st.success(), "ip {args:?}");
}
