use super::range::{parse_content_range, resume, ContentRange, Resume};
use super::*;

#[test]
fn a_record_round_trips_and_other_versions_are_refused() {
    let r = StoredRecord::started("http://x/m.gguf", 1234, Some("\"e1\"".into()), None);
    let back = StoredRecord::parse(r.to_json().as_bytes(), "record.json").unwrap();
    assert_eq!(back, r);
    assert!(!back.complete);
    let other = r.to_json().replace("\"version\":1", "\"version\":7");
    let e = StoredRecord::parse(other.as_bytes(), "m/record.json").unwrap_err();
    assert!(e.to_string().contains("version 7"), "{e}");
    for bad in [
        &b"{}"[..],
        b"not json",
        b"{\"version\":1,\"url\":\"\",\"bytes\":1,\"complete\":true}",
    ] {
        let e = StoredRecord::parse(bad, "m/record.json").unwrap_err();
        assert!(e.to_string().starts_with("m/record.json: "), "{e}");
    }
    let huge = vec![b' '; RECORD_MAX_BYTES + 1];
    assert!(StoredRecord::parse(&huge, "r").is_err());
    // unknown fields are someone else's record
    let extra = r.to_json().replace("{", "{\"x\":1,");
    assert!(StoredRecord::parse(extra.as_bytes(), "r").is_err());
}

#[test]
fn validators_compare_what_both_sides_know() {
    let r = StoredRecord::started("u", 1, Some("a".into()), Some("Mon".into()));
    assert!(r.same_file(Some("a"), Some("Tue")));
    assert!(!r.same_file(Some("b"), Some("Mon")));
    assert!(r.same_file(None, Some("Mon")));
    assert!(!r.same_file(None, Some("Tue")));
    assert!(r.same_file(None, None));
    let bare = StoredRecord::started("u", 1, None, None);
    assert!(bare.same_file(Some("x"), Some("y")));
}

#[test]
fn names_are_file_names() {
    let a = entry_name("http://127.0.0.1:8080/models/a.gguf?x=1#y");
    assert_eq!(a.len(), 32);
    assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(a, entry_name("http://127.0.0.1:8080/models/b.gguf"));
    assert_eq!(folder_name("emberlm-models-v1"), "emberlm-models-v1");
    for odd in ["", ".", "..", "a/b", "my models", "ü"] {
        let f = folder_name(odd);
        assert!(f.starts_with("store-") && f.len() == 22, "{odd:?} -> {f}");
    }
    assert_ne!(folder_name("a/b"), folder_name("a\\b"));
    for i in [0, 7, 12345, 99999] {
        assert_eq!(part_index(&part_name(i)), Some(i));
    }
    for not in [
        "part-1",
        "part-000001",
        "part-0000x",
        "record.json",
        "xpart-00001",
    ] {
        assert_eq!(part_index(not), None, "{not}");
    }
}

#[test]
fn digests_parse_one_per_file() {
    let a = "a".repeat(64);
    let b = format!("sha256:{}", "0F".repeat(32));
    let d = parse_digests(&format!(" {a}, {b}\n")).unwrap();
    assert_eq!(d, vec![[0xaa; 32], [0x0f; 32]]);
    for bad in ["", " , ", "abc", &"g".repeat(64), &"a".repeat(65)] {
        let e = parse_digests(bad).unwrap_err().to_string();
        assert!(e.contains("sha256"), "{bad:?}: {e}");
    }
    assert!(check_digest("m.gguf", &[1; 32], &[1; 32]).is_ok());
    let e = check_digest("m.gguf", &[1; 32], &[2; 32])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("m.gguf") && e.contains(&"01".repeat(32)) && e.contains(&"02".repeat(32)),
        "{e}"
    );
}

#[test]
fn room_is_checked_with_the_numbers() {
    assert!(check_room("m.gguf in `s`", 10, 100, 90).is_ok());
    let e = check_room("m.gguf in `s`", 11, 100, 90).unwrap_err();
    assert_eq!(e.kind(), "Quota");
    let text = e.to_string();
    assert!(
        text.contains("m.gguf in `s`") && text.contains("11") && text.contains("10 are free"),
        "{text}"
    );
    // usage past the quota leaves nothing free, not a wrapped number
    assert!(check_room("m", 1, 100, 200).is_err());
}

#[test]
fn content_ranges_parse_strictly() {
    assert_eq!(
        parse_content_range("bytes 100-199/1000"),
        Some(ContentRange {
            first: 100,
            last: 199,
            total: Some(1000)
        })
    );
    assert_eq!(
        parse_content_range(" bytes  0-0/*"),
        Some(ContentRange {
            first: 0,
            last: 0,
            total: None
        })
    );
    for bad in [
        "",
        "bytes",
        "bytes */1000",
        "bytes 5-4/10",
        "bytes 0-10/10",
        "items 0-1/2",
        "bytes 0-1,3-4/10",
        "bytes -1/10",
        "bytes 0-/10",
        "bytes 1-2/x",
        "bytes0-1/2",
        "bytes 99999999999999999999999-1/2",
    ] {
        assert_eq!(parse_content_range(bad), None, "{bad}");
    }
}

#[test]
fn a_resume_continues_only_on_the_rest_of_the_same_file() {
    assert_eq!(
        resume(100, 206, Some("bytes 100-999/1000"), 900, 1000),
        Resume::Continue
    );
    assert_eq!(
        resume(100, 206, Some("bytes 100-999/*"), 900, 1000),
        Resume::Continue
    );
    assert_eq!(resume(100, 200, None, 1000, 1000), Resume::FromStart);
    assert_eq!(resume(100, 404, None, 0, 1000), Resume::Failed(404));
    // no readable Content-Range: only a body of exactly the missing length
    assert_eq!(resume(100, 206, None, 900, 1000), Resume::Continue);
    for (range, why) in [
        (Some("bytes 0-999/1000"), "from 0"),
        (Some("bytes 100-999/2000"), "changed"),
        (Some("bytes 100-500/1000"), "up to 500"),
        (Some("bogus"), "unreadable"),
        (None, "Expose-Headers"),
    ] {
        match resume(100, 206, range, 800, 1000) {
            Resume::Refetch(reason) => assert!(reason.contains(why), "{range:?}: {reason}"),
            other => panic!("{range:?}: {other:?}"),
        }
    }
    assert!(matches!(
        resume(100, 416, None, 0, 1000),
        Resume::Refetch(_)
    ));
    // a total unknown at first takes the server's word
    assert_eq!(
        resume(100, 206, Some("bytes 100-199/200"), 100, 0),
        Resume::Continue
    );
}

#[test]
fn the_storage_option_reads_its_three_names() {
    assert_eq!(Medium::parse("auto").unwrap(), Medium::Auto);
    assert_eq!(Medium::parse("OPFS").unwrap(), Medium::Opfs);
    for s in ["cacheApi", "cache-api", "cache_api", "cache"] {
        assert_eq!(Medium::parse(s).unwrap(), Medium::CacheApi, "{s}");
    }
    let e = Medium::parse("indexeddb").unwrap_err().to_string();
    assert!(e.contains("storage") && e.contains("indexeddb"), "{e}");
}
