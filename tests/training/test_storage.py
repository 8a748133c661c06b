"""Storage behind s3:// URIs, on real directories."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyperplan.objects.storage import Storage
from hyperplan.objects.uris import TEMP_PREFIX, StorageError, join_uri, parse_s3_uri


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    mapped = tmp_path / "mapped-dir"
    mapped.mkdir()
    return Storage({"mapped": str(mapped)}, tmp_path / "s3")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def files_under(directory: Path) -> dict[str, str]:
    return {
        p.relative_to(directory).as_posix(): p.read_text()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


# --- URIs ----------------------------------------------------------------------------------------------


def test_parse_s3_uri_splits_bucket_and_key() -> None:
    assert parse_s3_uri("s3://bucket/a/b.csv") == ("bucket", "a/b.csv")
    assert parse_s3_uri("s3://bucket/prefix/") == ("bucket", "prefix/")
    assert parse_s3_uri("s3://bucket") == ("bucket", "")
    assert (
        join_uri("s3://bkt/out/", "job", "output", "model.tar.gz") == "s3://bkt/out/job/output/model.tar.gz"
    )
    assert join_uri("s3://b", "job") == "s3://b/job"


@pytest.mark.parametrize(
    ("uri", "complaint"),
    [
        ("https://bucket/key", "not an s3:// URI"),
        ("s3:///key", "names no bucket"),
        ("s3://bucket/../other/key", "'..'"),
        ("s3://bucket/a/../../etc/passwd", "'..'"),
        ("s3://bucket/a/./b", "'.'"),
        ("s3://bucket/a//b", "empty"),
        ("s3://bucket/a\0b", "NUL"),
    ],
)
def test_bad_uris_are_refused_naming_the_uri(uri: str, complaint: str) -> None:
    with pytest.raises(StorageError) as caught:
        parse_s3_uri(uri)
    assert caught.value.uri == uri
    assert str(caught.value).startswith(f"{uri}: ")
    assert complaint in str(caught.value)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab./", max_size=12))
def test_no_accepted_key_leaves_its_bucket(key: str) -> None:
    root = Path("/srv/s3/bucket")
    try:
        _, parsed = parse_s3_uri(f"s3://bucket/{key}")
    except StorageError:
        return
    assert os.path.normpath(root / parsed).startswith(str(root))
    assert ".." not in Path(parsed).parts


def test_traversal_is_refused_on_every_operation(storage: Storage, tmp_path: Path) -> None:
    source = write(tmp_path / "src" / "f.txt", "x")
    for attempt in (
        lambda: storage.upload_file(source, "s3://bkt/../escape.txt"),
        lambda: storage.upload_dir(source.parent, "s3://bkt/x/../../escape"),
        lambda: storage.download_prefix("s3://bkt/../../etc", tmp_path / "dest"),
        lambda: storage.exists("s3://bkt/../s3/b/f.txt"),
    ):
        with pytest.raises(StorageError, match=r"'\.\.' path segment"):
            attempt()
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "s3" / "escape.txt").exists()


# --- round trips ---------------------------------------------------------------------------------------


def test_a_file_round_trips_through_a_default_root_bucket(storage: Storage, tmp_path: Path) -> None:
    source = write(tmp_path / "src" / "data.csv", "a,b\n1,2\n")
    storage.upload_file(source, "s3://fresh-bucket/train/data.csv")
    assert (tmp_path / "s3" / "fresh-bucket" / "train" / "data.csv").read_text() == "a,b\n1,2\n"
    assert storage.exists("s3://fresh-bucket/train/data.csv")
    assert not storage.exists("s3://fresh-bucket/train/other.csv")
    assert not storage.exists("s3://fresh-bucket/train")  # a prefix is not an object

    # A URI that names one object fetches just that object, under its own name.
    assert storage.download_prefix("s3://fresh-bucket/train/data.csv", tmp_path / "one") == 1
    assert files_under(tmp_path / "one") == {"data.csv": "a,b\n1,2\n"}


def test_a_directory_round_trips_keeping_relative_paths(storage: Storage, tmp_path: Path) -> None:
    source = tmp_path / "src"
    tree = {"a.txt": "A", "sub/b.txt": "B", "sub/deeper/c.txt": "C"}
    for name, text in tree.items():
        write(source / name, text)
    assert storage.upload_dir(source, "s3://mapped/runs/1/") == 3
    assert files_under(tmp_path / "mapped-dir" / "runs" / "1") == tree
    assert [item.key for item in storage.list("s3://mapped/runs/1")] == [
        "runs/1/a.txt",
        "runs/1/sub/b.txt",
        "runs/1/sub/deeper/c.txt",
    ]
    assert storage.list("s3://mapped/runs/1")[1].uri == "s3://mapped/runs/1/sub/b.txt"
    assert storage.download_prefix("s3://mapped/runs/1", tmp_path / "back") == 3
    assert files_under(tmp_path / "back") == tree


def test_a_prefix_is_a_whole_directory(storage: Storage, tmp_path: Path) -> None:
    bucket = tmp_path / "s3" / "bkt"
    write(bucket / "data" / "train" / "1.csv", "in")
    write(bucket / "data" / "training.csv", "not in")
    assert storage.download_prefix("s3://bkt/data/train", tmp_path / "d1") == 1
    assert files_under(tmp_path / "d1") == {"1.csv": "in"}
    assert storage.download_prefix("s3://bkt/data/train/", tmp_path / "d2") == 1
    assert storage.download_prefix("s3://bkt/nothing/here", tmp_path / "d3") == 0


def test_sharding_splits_objects_between_hosts_in_key_order(storage: Storage, tmp_path: Path) -> None:
    for index in range(5):
        write(tmp_path / "s3" / "bkt" / "p" / f"{index}.csv", str(index))
    assert storage.download_prefix("s3://bkt/p", tmp_path / "h0", shard=(0, 2)) == 3
    assert storage.download_prefix("s3://bkt/p", tmp_path / "h1", shard=(1, 2)) == 2
    assert set(files_under(tmp_path / "h0")) == {"0.csv", "2.csv", "4.csv"}
    assert set(files_under(tmp_path / "h1")) == {"1.csv", "3.csv"}


# --- missing buckets -----------------------------------------------------------------------------------


def test_reading_a_missing_bucket_names_the_uri(storage: Storage, tmp_path: Path) -> None:
    for read in (
        lambda: storage.download_prefix("s3://ghost/data", tmp_path / "d"),
        lambda: storage.list("s3://ghost/data"),
        lambda: storage.exists("s3://ghost/data/x"),
    ):
        with pytest.raises(StorageError) as caught:
            read()
        assert caught.value.uri.startswith("s3://ghost/data")
        assert "no such bucket 'ghost'" in str(caught.value)


def test_a_missing_object_is_named(storage: Storage, tmp_path: Path) -> None:
    (tmp_path / "s3" / "bkt").mkdir(parents=True)
    with pytest.raises(StorageError, match=r"^s3://bkt/code/sourcedir.tar.gz: no such object"):
        storage.download_file("s3://bkt/code/sourcedir.tar.gz", tmp_path / "x.tar.gz")


def test_a_mapped_bucket_whose_directory_is_gone_is_an_error_even_for_writes(tmp_path: Path) -> None:
    storage = Storage({"mapped": str(tmp_path / "not-there")}, tmp_path / "s3")
    source = write(tmp_path / "f.txt", "x")
    with pytest.raises(StorageError) as caught:
        storage.upload_file(source, "s3://mapped/k.txt")
    assert caught.value.uri == "s3://mapped/k.txt"
    assert "not-there" in str(caught.value)
    assert not (tmp_path / "not-there").exists()
    with pytest.raises(StorageError, match="no such bucket 'mapped'"):
        storage.list("s3://mapped/")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads everything")
def test_an_unreadable_object_is_access_denied_naming_the_uri(storage: Storage, tmp_path: Path) -> None:
    secret = write(tmp_path / "s3" / "bkt" / "secret.txt", "x")
    secret.chmod(0)
    with pytest.raises(StorageError, match=r"^s3://bkt/secret.txt: access denied"):
        storage.download_prefix("s3://bkt/secret.txt", tmp_path / "d")


# --- atomic writes -------------------------------------------------------------------------------------


def test_a_failed_write_leaves_the_old_object_and_no_temporary_file(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.upload_file(write(tmp_path / "v1.txt", "version 1"), "s3://bkt/obj.txt")

    def broken_copy(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", broken_copy)
    with pytest.raises(StorageError, match=r"^s3://bkt/obj.txt: No space left on device"):
        storage.upload_file(write(tmp_path / "v2.txt", "version 2"), "s3://bkt/obj.txt")
    assert os.listdir(tmp_path / "s3" / "bkt") == ["obj.txt"]
    assert (tmp_path / "s3" / "bkt" / "obj.txt").read_text() == "version 1"


def test_a_reader_never_sees_half_an_object(storage: Storage, tmp_path: Path) -> None:
    size = 4 << 20
    versions = [write(tmp_path / f"v{n}", chr(ord("a") + n) * size) for n in range(2)]
    storage.upload_file(versions[0], "s3://bkt/big")
    done = threading.Event()

    def keep_writing() -> None:
        for round_ in range(20):
            storage.upload_file(versions[round_ % 2], "s3://bkt/big")
        done.set()

    writer = threading.Thread(target=keep_writing)
    writer.start()
    seen = set()
    while not done.is_set():
        content = (tmp_path / "s3" / "bkt" / "big").read_bytes()
        assert len(content) == size and content[0] == content[-1]
        seen.add(content[:1])
    writer.join()
    assert seen  # the reader ran while objects were being replaced
    assert not [name for name in os.listdir(tmp_path / "s3" / "bkt") if name.startswith(TEMP_PREFIX)]


def test_files_being_written_are_not_listed(storage: Storage, tmp_path: Path) -> None:
    write(tmp_path / "s3" / "bkt" / "p" / "done.txt", "x")
    write(tmp_path / "s3" / "bkt" / "p" / f"{TEMP_PREFIX}abc", "half")
    assert [item.key for item in storage.list("s3://bkt/p")] == ["p/done.txt"]


# --- sync ----------------------------------------------------------------------------------------------


def test_sync_uploads_only_new_and_changed_files(storage: Storage, tmp_path: Path) -> None:
    local = tmp_path / "ckpt"
    write(local / "a.npz", "aaaa")
    write(local / "nested" / "b.npz", "bbbb")
    assert storage.sync_dir_to(local, "s3://bkt/ckpt") == 2
    assert storage.sync_dir_to(local, "s3://bkt/ckpt") == 0

    changed = write(local / "a.npz", "AAAA")  # same size, new content, newer mtime
    stat = changed.stat()
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    write(local / "c.npz", "c")
    assert storage.sync_dir_to(local, "s3://bkt/ckpt") == 2
    assert files_under(tmp_path / "s3" / "bkt" / "ckpt") == {
        "a.npz": "AAAA",
        "nested/b.npz": "bbbb",
        "c.npz": "c",
    }

    # What was downloaded keeps the stored mtime, so syncing it back uploads nothing.
    restored = tmp_path / "restored"
    storage.download_prefix("s3://bkt/ckpt", restored)
    assert storage.sync_dir_to(restored, "s3://bkt/ckpt") == 0

    # Deleting locally deletes nothing stored.
    (local / "c.npz").unlink()
    assert storage.sync_dir_to(local, "s3://bkt/ckpt") == 0
    assert (tmp_path / "s3" / "bkt" / "ckpt" / "c.npz").exists()


def test_a_permission_failure_while_writing_is_access_denied_naming_the_uri(
    storage: Storage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refused(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/some/file")

    monkeypatch.setattr(shutil, "copyfileobj", refused)
    with pytest.raises(
        StorageError, match=r"^s3://bkt/k.txt: access denied \(Permission denied: /some/file\)"
    ):
        storage.upload_file(write(tmp_path / "f", "x"), "s3://bkt/k.txt")


def test_sync_from_storage_fetches_only_what_is_missing_or_older_locally(
    storage: Storage, tmp_path: Path
) -> None:
    stored = tmp_path / "s3" / "bkt" / "ckpt"
    write(stored / "old.npz", "stored old")
    write(stored / "new.npz", "stored new")
    local = tmp_path / "local"
    assert storage.sync_dir_from("s3://bkt/ckpt", local) == 2
    assert storage.sync_dir_from("s3://bkt/ckpt", local) == 0

    newer_locally = write(local / "old.npz", "written since")
    later = (stored / "old.npz").stat().st_mtime_ns + 1_000_000_000
    os.utime(newer_locally, ns=(later, later))
    (local / "new.npz").unlink()
    assert storage.sync_dir_from("s3://bkt/ckpt", local) == 1
    assert files_under(local) == {"old.npz": "written since", "new.npz": "stored new"}


def test_the_service_keeps_unmapped_buckets_in_its_data_dir(tmp_path: Path) -> None:
    storage = Storage.in_data_dir(tmp_path / "data", {})
    storage.upload_file(write(tmp_path / "f", "x"), "s3://team-bucket/k")
    assert (tmp_path / "data" / "s3" / "team-bucket" / "k").read_text() == "x"


def test_restoring_from_a_mapped_bucket_that_is_gone_is_an_error(tmp_path: Path) -> None:
    storage = Storage({"mapped": str(tmp_path / "not-there")}, tmp_path / "s3")
    assert storage.sync_dir_from("s3://never-written/ckpt", tmp_path / "a") == 0
    with pytest.raises(StorageError, match=r"^s3://mapped/ckpt: no such bucket 'mapped'"):
        storage.sync_dir_from("s3://mapped/ckpt", tmp_path / "b")


# --- bucket names, encoded keys and symbolic links (issue 15, item 4) ------------------------------------


@pytest.mark.parametrize(
    ("bucket", "complaint"),
    [
        ("..", "3 to 63 characters"),
        (".", "3 to 63 characters"),
        ("...", "must start and end with a letter or a digit"),
        ("a..b", "two dots in a row"),
        ("ab", "3 to 63 characters"),
        ("a" * 64, "3 to 63 characters"),
        ("Upper-Case", "lowercase letters"),
        ("under_score", "lowercase letters"),
        ("-leading", "must start and end"),
        ("trailing.", "must start and end"),
        ("192.168.5.4", "IP address"),
        ("%2e%2e", "lowercase letters"),
        ("..%2f..", "lowercase letters"),
    ],
)
def test_bucket_names_follow_s3s_rules(bucket: str, complaint: str) -> None:
    uri = f"s3://{bucket}/key"
    with pytest.raises(StorageError) as caught:
        parse_s3_uri(uri)
    assert str(caught.value).startswith(f"{uri}: bucket name {bucket!r}")
    assert complaint in str(caught.value)


@pytest.mark.parametrize("bucket", ["abc", "a" * 63, "my.data-set.2026", "1-2-3", "10.0.0.1x"])
def test_s3s_valid_bucket_names_are_accepted(bucket: str) -> None:
    assert parse_s3_uri(f"s3://{bucket}/k") == (bucket, "k")


@pytest.mark.parametrize(
    ("key", "complaint"),
    [
        ("a/%2e%2e/b", "encoded character '%2e'"),
        ("a%2F..%2Fb", "encoded character '%2F'"),
        ("a/%5c..", "encoded character '%5c'"),
        ("a\\..\\b", "backslash"),
        ("/etc/passwd", "'empty' path segment"),
        ("a/%00", "encoded character '%00'"),
    ],
)
def test_encoded_and_absolute_keys_are_refused(key: str, complaint: str) -> None:
    with pytest.raises(StorageError, match=complaint):
        parse_s3_uri(f"s3://bkt/{key}")


def test_a_bucket_named_dot_dot_reaches_nothing_beside_the_buckets(storage: Storage, tmp_path: Path) -> None:
    write(tmp_path / "credentials", "[hyperplan]\nsecret\n")
    source = write(tmp_path / "src" / "f.txt", "x")
    for attempt in (
        lambda: storage.download_prefix("s3://../credentials", tmp_path / "dest"),
        lambda: storage.download_prefix("s3://../", tmp_path / "dest"),
        lambda: storage.upload_file(source, "s3://../credentials"),
        lambda: storage.sync_dir_to(source.parent, "s3://./"),
    ):
        with pytest.raises(StorageError, match="bucket name"):
            attempt()
    assert not (tmp_path / "dest").exists()
    assert (tmp_path / "credentials").read_text() == "[hyperplan]\nsecret\n"


def test_no_symbolic_link_in_a_bucket_is_followed_outside_it(storage: Storage, tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.txt", "server's secret")
    bucket = tmp_path / "s3" / "bkt"
    write(bucket / "data" / "ok.csv", "1\n")
    (bucket / "data" / "secret.csv").symlink_to(outside)
    (bucket / "linked-dir").symlink_to(outside.parent, target_is_directory=True)
    (bucket / "inside.csv").symlink_to(bucket / "data" / "ok.csv")  # a link within the bucket is fine

    for attempt in (
        lambda: storage.download_prefix("s3://bkt/data/secret.csv", tmp_path / "one"),
        lambda: storage.download_prefix("s3://bkt/data", tmp_path / "all"),
        lambda: storage.download_prefix("s3://bkt/linked-dir/secret.txt", tmp_path / "through"),
        lambda: storage.list("s3://bkt/linked-dir/"),
        lambda: storage.exists("s3://bkt/linked-dir/secret.txt"),
    ):
        with pytest.raises(StorageError, match="symbolic link in the bucket leads outside it"):
            attempt()
    for directory in ("one", "all", "through"):
        assert not (tmp_path / directory / "secret.csv").exists()
        assert not (tmp_path / directory / "secret.txt").exists()
    assert storage.download_prefix("s3://bkt/inside.csv", tmp_path / "fine") == 1

    # A write through the linked directory would land outside the bucket: refused, nothing written.
    source = write(tmp_path / "src" / "new.txt", "tenant data")
    with pytest.raises(StorageError, match="symbolic link in the bucket leads outside it"):
        storage.upload_file(source, "s3://bkt/linked-dir/new.txt")
    assert sorted(os.listdir(outside.parent)) == ["secret.txt"]


def test_no_symbolic_link_is_followed_out_of_a_local_directory(storage: Storage, tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.txt", "server's secret")
    output = tmp_path / "job-output"
    write(output / "model.bin", "weights")
    (output / "stolen.txt").symlink_to(outside)
    with pytest.raises(StorageError, match="symbolic link that leads outside"):
        storage.upload_dir(output, "s3://bkt/out/")
    assert not (tmp_path / "s3" / "bkt" / "out" / "stolen.txt").exists()
    with pytest.raises(StorageError, match="a symbolic link, not followed"):
        storage.upload_file(output / "stolen.txt", "s3://bkt/stolen.txt")

    # A download into a directory whose subdirectory links outside writes nothing there.
    write(tmp_path / "s3" / "bkt" / "ckpt" / "sub" / "c.npz", "ckpt")
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "sub").symlink_to(outside.parent, target_is_directory=True)
    with pytest.raises(StorageError, match=r"symbolic link in .*dest leads outside it"):
        storage.sync_dir_from("s3://bkt/ckpt", dest)
    assert sorted(os.listdir(outside.parent)) == ["secret.txt"]
