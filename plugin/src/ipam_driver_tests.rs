use super::*;

/// Records what the ADD flow asked of it; its undo fails when told to.
#[derive(Default)]
struct Recorder {
    calls: Vec<&'static str>,
    undo_fails: bool,
}

impl Ipam for Recorder {
    fn add(&mut self, _: Prepared, _: bool) -> CniResult<Allocation> {
        self.calls.push("add");
        let unproven = vec!["10.0.0.5".parse().unwrap()];
        Ok(Allocation::undone_by_del(CniOutput::default(), unproven))
    }
    fn undo_add(&mut self, _: Allocation) -> CniResult<()> {
        self.calls.push("undo");
        if self.undo_fails {
            return Err(CniError::new(code::STORE_UNREACHABLE, "api gone"));
        }
        Ok(())
    }
    fn succeeded(&mut self, _: &Allocation) {
        self.calls.push("succeeded");
    }
    fn report_refusal(&mut self, _: &CniError) {
        self.calls.push("refusal");
    }
    fn del(&mut self) -> CniResult<()> {
        Ok(())
    }
    fn check(&mut self) -> CniResult<()> {
        Ok(())
    }
    fn status(&mut self) -> CniResult<()> {
        Ok(())
    }
    fn gc(&mut self, _: &[(String, String)]) -> CniResult<()> {
        Ok(())
    }
}

#[test]
fn an_add_is_confirmed_only_after_the_bind_and_undone_when_it_fails() {
    let mut ok = Recorder::default();
    let got = add_and_bind(&mut ok, Prepared::Nothing, false, |a| Ok(a.unproven.len()));
    assert_eq!(got.unwrap(), 1);
    assert_eq!(ok.calls, ["add", "succeeded"]);

    let refused = || {
        CniError::new(
            code::TRY_AGAIN_LATER,
            "10.0.0.5 answers from 02:00:00:00:00:09",
        )
    };
    let mut wire = Recorder::default();
    let e = add_and_bind(&mut wire, Prepared::Nothing, false, |_| {
        Err::<(), _>(refused())
    })
    .unwrap_err();
    assert_eq!(wire.calls, ["add", "refusal", "undo"]);
    assert_eq!(e.code, code::TRY_AGAIN_LATER);

    // A failed undo is reported with the refusal, which keeps its code.
    let mut stuck = Recorder {
        undo_fails: true,
        ..Recorder::default()
    };
    let e = add_and_bind(&mut stuck, Prepared::Nothing, false, |_| {
        Err::<(), _>(refused())
    })
    .unwrap_err();
    assert_eq!(e.code, code::TRY_AGAIN_LATER);
    assert!(
        e.msg.contains("02:00:00:00:00:09") && e.msg.contains("cannot release the IPAM"),
        "{}",
        e.msg
    );
}

#[test]
fn delegate_error_keeps_code_and_names_the_plugin() {
    let e = decode_delegate_error(
        br#"{"code":11,"msg":"busy","details":"d"}"#,
        "ipam plugin \"x\" ADD",
        Some(1),
    );
    assert_eq!(e.code, 11);
    assert_eq!(e.msg, "ipam plugin \"x\" ADD: busy");
    assert_eq!(e.details, "d");
}

#[test]
fn garbage_from_a_delegate_is_our_code() {
    let e = decode_delegate_error(b"panic: oops", "ipam plugin \"x\" ADD", Some(2));
    assert_eq!(e.code, code::IPAM_DELEGATE);
    assert!(e.msg.contains("exit code 2") && e.msg.contains("panic: oops"));
}

#[test]
fn missing_plugin_is_a_config_error() {
    let e = find_in_path("no-such-ipam", "/nonexistent:/also-not").unwrap_err();
    assert_eq!(e.code, code::INVALID_CONFIG);
    assert!(e.msg.contains("no-such-ipam"));
}

#[test]
fn finds_an_executable_in_path() {
    assert!(find_in_path("sh", "/nonexistent:/bin").is_ok());
}
