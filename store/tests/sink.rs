//! The local staged sink: nothing at the final path until commit, nothing left after a drop, no replacement of an
//! existing file unless asked.

use quantfarm_store::{Error, Location, StagedSink};

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().build().unwrap()
}

fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<_> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn commit_makes_the_file_appear_whole_and_drop_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("out.gguf");
    rt().block_on(async {
        let mut sink = StagedSink::create(&Location::local(&target), false).await.unwrap();
        sink.write(&[7u8; 3 << 20]).await.unwrap();
        assert!(!target.exists(), "visible before commit");
        let staged = names(dir.path());
        assert_eq!(staged.len(), 1);
        assert!(staged[0].starts_with(".out.gguf.partial-"), "{staged:?}");
        let c = sink.commit().await.unwrap();
        assert_eq!(c.bytes, 3 << 20);
        assert_eq!(std::fs::read(&target).unwrap(), vec![7u8; 3 << 20]);
        assert_eq!(names(dir.path()), ["out.gguf"]);

        {
            let mut dropped = StagedSink::create(&Location::local(dir.path().join("other.gguf")), false).await.unwrap();
            dropped.write(b"partial").await.unwrap();
        }
        assert_eq!(names(dir.path()), ["out.gguf"], "a dropped sink left files");

        match StagedSink::create(&Location::local(&target), false).await {
            Err(Error::Exists { path }) => assert_eq!(path, target),
            other => panic!("expected Exists, got {:?}", other.map(|_| ())),
        }
        let mut again = StagedSink::create(&Location::local(&target), true).await.unwrap();
        again.write(b"new").await.unwrap();
        again.commit().await.unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
    });
}

#[test]
fn a_file_created_meanwhile_is_not_clobbered_at_commit() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("race.gguf");
    rt().block_on(async {
        let mut sink = StagedSink::create(&Location::local(&target), false).await.unwrap();
        sink.write(b"ours").await.unwrap();
        std::fs::write(&target, b"theirs").unwrap();
        assert!(matches!(sink.commit().await, Err(Error::Exists { .. })));
        assert_eq!(std::fs::read(&target).unwrap(), b"theirs");
        assert_eq!(names(dir.path()), ["race.gguf"], "the staged file was left behind");
    });
}
