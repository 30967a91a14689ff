"""The pure pieces of the environment build: which changed paths are read, the secret scanner,
the log's head and tail, the committed config."""

import base64
import os
import stat
from pathlib import Path

from sandbox.environment.build import commit_config
from sandbox.environment.secret_scan import SecretScanner, changed_paths, changes_on_disk, encodings
from sandbox.environment.setup_run import LOG_HEAD_BYTES, LOG_TAIL_BYTES, LogCapture
from sandbox.environment.spec import EnvironmentSpec

SECRET = "s3cr3t-value-0123456789abcdef"


def test_changed_paths_reads_added_roots_and_changed_files_only() -> None:
    diff = [
        {"Path": "/opt", "Kind": 0},
        {"Path": "/opt/env", "Kind": 1},
        {"Path": "/opt/env/bin", "Kind": 1},
        {"Path": "/opt/env/bin/hello", "Kind": 1},
        {"Path": "/var", "Kind": 0},
        {"Path": "/var/tmp", "Kind": 0},
        {"Path": "/var/tmp/old", "Kind": 2},
        {"Path": "/var/tmp/notes", "Kind": 0},
        {"Path": "/tmp", "Kind": 0},
        {"Path": "/tmp/x", "Kind": 1},
        {"Path": "/home/agent/.cache", "Kind": 1},
        {"Path": "/workspace", "Kind": 0},
        {"Path": "/run", "Kind": 0},
        {"Path": "/run/secrets", "Kind": 1},
        {"Path": "/etc/hostname", "Kind": 0},
    ]
    assert list(changed_paths(diff)) == [
        ("/etc/hostname", True),
        ("/opt", False),
        ("/opt/env", True),  # once, with everything under it
        ("/run", False),
        ("/var", False),
        ("/var/tmp", False),  # a directory: its changed children are listed
        ("/var/tmp/notes", True),
    ]


def test_scanner_finds_values_across_chunks_and_encodings() -> None:
    data = b"x" * 1000 + SECRET.encode() + b"y" * 1000
    for size in (1, 7, 64, 5000):
        scanner = SecretScanner({"TOKEN": SECRET})
        scanner.feed_stream(data[i : i + size] for i in range(0, len(data), size))
        assert scanner.found == "TOKEN", size
    for prefix in (b"", b"a", b"ab", b"abc", b"password="):
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            scanner = SecretScanner({"OTHER": "unrelated-value", "TOKEN": SECRET})
            scanner.feed_named("test", encode(prefix + SECRET.encode() + b"\n"))
            assert scanner.found == "TOKEN", (prefix, encode)
    clean = SecretScanner({"TOKEN": SECRET, "EMPTY": ""})
    clean.feed_stream([b"nothing here", base64.b64encode(b"nor here")])
    assert clean.found == ""
    assert all(len(e) >= 8 for e in encodings(SECRET))


def test_log_keeps_head_and_tail() -> None:
    log = LogCapture()
    log.feed(b"H" * LOG_HEAD_BYTES)
    log.feed(b"m" * 100_000)
    log.feed(b"T" * LOG_TAIL_BYTES)
    text = log.text()
    assert text.startswith("H" * LOG_HEAD_BYTES + "\n[... 100000 bytes cut ...]\n")
    assert text.endswith("T" * LOG_TAIL_BYTES)


def test_commit_config_blanks_the_build_container_labels() -> None:
    base = {
        "Env": ["PATH=/usr/bin:/bin", "HOME=/home/agent"],
        "Labels": {"org.forgehand.sandbox.version": "2"},
        "User": "1000:1000",
        "Cmd": ["sleep", "infinity"],
        "WorkingDir": "/workspace",
    }
    spec = EnvironmentSpec(image="i", env={"HOME": "/home/agent", "TOOL": "1"})
    conf = commit_config(
        base,
        spec,
        {"forgehand.environment": "k"},
        container_labels={"forgehand.weakened": "writable root", "forgehand.run": "r"},
    )
    assert conf["Env"] == ["PATH=/usr/bin:/bin:/opt/env/bin", "HOME=/home/agent", "TOOL=1"]  # the image's first
    assert conf["Labels"] == {
        "forgehand.weakened": "",
        "forgehand.run": "",
        "org.forgehand.sandbox.version": "2",
        "forgehand.environment": "k",
    }
    assert (conf["User"], conf["Cmd"], conf["Entrypoint"], conf["WorkingDir"]) == (
        "1000:1000",
        ["sleep", "infinity"],
        [],
        "/workspace",
    )


def test_the_layer_directory_lists_what_the_setup_changed(tmp_path: Path) -> None:
    """`changes_on_disk` reads overlay2's upper directory as `container.diff()` would list it:
    every entry added, a whiteout (a 0/0 character device, which only root can make) deleted,
    symbolic links listed and never followed, at most `limit` entries."""
    (tmp_path / "opt" / "env").mkdir(parents=True)
    (tmp_path / "opt" / "env" / "token.txt").write_text("x")
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "link").symlink_to("/run/secrets/T")
    whiteout = os.geteuid() == 0
    if whiteout:
        os.mknod(tmp_path / "etc" / "gone", stat.S_IFCHR | 0o600, os.makedev(0, 0))
    found = {c["Path"]: c["Kind"] for c in changes_on_disk(tmp_path, 100)}
    expected = {"/opt": 1, "/opt/env": 1, "/opt/env/token.txt": 1, "/etc": 1, "/etc/link": 1}
    assert found == {**expected, **({"/etc/gone": 2} if whiteout else {})}
    assert len(changes_on_disk(tmp_path, 2)) == 2
