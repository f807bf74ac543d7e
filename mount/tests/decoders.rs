//! Whatever bytes arrive — on the control socket or in a damaged index — decoding
//! never panics, and what decodes is handled safely.

use std::fs;
use std::path::Path;

use proptest::prelude::*;
use stagefs_control::Request;
use stagefs_mount::admin::{Live, answer};
use stagefs_store::{Budget, Store};

fn any_line() -> impl Strategy<Value = String> {
    prop_oneof![
        ".*",
        // Near-misses of real requests and records exercise the deeper decoders.
        r#"\{"op":"(stats|status|evict|verify|prefetch|put|touch|remove|header)"(,"[a-z_]{1,8}":("[^"]{0,12}"|[0-9]{1,20}|null|true|\{\}|\[\]))*\}"#,
        r#"\{"op":"evict","selector":\{"by":"(path|model|all|older_than|to_size)","(path|id|secs|bytes)":"[./a-z0-9-]{0,20}"\},"dry_run":(true|false)\}"#,
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn control_requests_decode_or_fail_cleanly(line in any_line()) {
        if let Ok(request) = serde_json::from_str::<Request>(&line) {
            let text = serde_json::to_string(&request).expect("encode");
            prop_assert_eq!(serde_json::from_str::<Request>(&text).ok(), Some(request));
        }
    }

    #[test]
    fn decoded_requests_never_touch_anything_outside_the_cache(line in any_line()) {
        let Ok(request) = serde_json::from_str::<Request>(&line) else { return Ok(()) };
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = dir.path().join("outside");
        fs::write(&outside, b"keep me").expect("write");
        let store = Store::open(dir.path().join("cache"), Budget::default()).expect("store");
        let _ = answer(request, &store, None, Live::default());
        prop_assert_eq!(fs::read(&outside).expect("still there"), b"keep me");
    }

    #[test]
    fn a_damaged_index_never_panics_and_never_invents_entries(lines in proptest::collection::vec(any_line(), 0..20)) {
        let dir = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(dir.path().join("v1")).expect("mkdir");
        fs::write(dir.path().join("v1/index.jsonl"), lines.join("\n")).expect("write");
        if let Ok(store) = Store::open(dir.path(), Budget::default()) {
            // No data files exist, so reconciliation must have dropped every entry.
            prop_assert_eq!(store.entries().len(), 0);
        }
    }
}

#[test]
fn path_requests_outside_the_source_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path(), Budget::default()).expect("store");
    for path in ["../../etc/passwd", "/etc/passwd", "a/../../b", ""] {
        let request: Request = serde_json::from_value(serde_json::json!({
            "op": "evict", "selector": {"by": "path", "path": path}, "dry_run": false
        }))
        .expect("decodes");
        let response = answer(request, &store, None, Live::default());
        let text = serde_json::to_string(&response).expect("encode");
        assert!(text.contains("\"kind\":\"error\""), "{path}: {text}");
    }
    assert!(Path::new("/etc/passwd").exists());
}
