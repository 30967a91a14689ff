"""What an environment's setup left in the image it would become, read back and searched for its
secrets (sandbox/environment/build.py's module doc says what is caught and what is not): the
container's changes (`container.diff()`) outside the mounts, each read once with `get_archive`,
and the image's settings, for each value raw and base64-encoded; the commit runs meanwhile."""

import base64
import contextlib
import json
import os
import stat
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any

import docker
import docker.errors

from sandbox.spec import CHANNEL_DIR, HOME_DIR, WORKSPACE_DIR

SECRETS_DIR = "/run/secrets"
# Mounts of the build container: written to by the setup, never in the committed layer.
NOT_COMMITTED = ("/tmp", HOME_DIR, WORKSPACE_DIR, SECRETS_DIR, CHANNEL_DIR)  # noqa: S108 (paths in the container)


class SecretScanner:
    """Finds any secret value, raw or base64-encoded, in streams of bytes (module doc)."""

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self._needles = [(name, needle) for name, value in secrets.items() if value for needle in encodings(value)]
        self._overlap = max((len(needle) for _, needle in self._needles), default=1) - 1
        self.found = ""

    @property
    def needles(self) -> int:
        """How many byte strings it looks for (0: no secret, nothing to find)."""
        return len(self._needles)

    def feed_stream(self, chunks: Iterable[bytes]) -> None:
        """Scan a stream whose chunks may cut a value in two."""
        carry = b""
        for chunk in chunks:
            window = carry + chunk
            self._scan(window)
            if self.found:
                return
            carry = window[-self._overlap :] if self._overlap else b""

    def feed_named(self, what: str, data: bytes) -> None:
        """Scan one whole piece (`what` says which, for a reader of the code)."""
        self._scan(data)

    def _scan(self, data: bytes) -> None:
        for name, needle in self._needles:
            if needle in data:
                self.found = name
                return


def encodings(value: str) -> list[bytes]:
    """The byte strings that betray `value`: itself, and the part of its base64 encoding that
    depends on the value alone at each of the three offsets it can start at within a longer
    encoded text, in the standard and URL-safe alphabets. Fragments under 8 characters are left
    out (they would match by chance)."""
    raw = value.encode()
    out = [raw]
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw)
        start = -(-offset * 8 // 6)  # the first character no padding byte feeds
        end = (offset + len(raw)) * 8 // 6  # past the last one no following byte feeds
        fragment = encoded[start:end]
        if len(fragment) >= 8:
            out.append(fragment)
            out.append(fragment.replace(b"+", b"-").replace(b"/", b"_"))
    return list(dict.fromkeys(out))


def commit_checked(
    client: docker.DockerClient,
    container_id: str,
    conf: dict[str, Any],
    scanner: "SecretScanner",
    changes: list[dict[str, Any]],
) -> tuple[str, str]:
    """Commit the container as an untagged image while its `changes` (`container.diff()`) are
    scanned for the secrets (the two take about as long: side by side, the build pays once). The
    image id, and the name of a secret found ("" for none): then, as when the scan itself fails,
    the image is removed again and nothing is tagged, so no cache lookup ever finds it. Without
    secrets there is nothing to look for."""
    scanner.feed_named("the image config", json.dumps(conf).encode())
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="forgehand-env-commit") as pool:
        committing = pool.submit(client.api.commit, container_id, conf=conf)
        try:
            if scanner.needles and not scanner.found:
                scan_changes(client, container_id, scanner, changes)
        except BaseException:
            _remove_image(client, str(committing.result()["Id"]))
            raise
        image_id = str(committing.result()["Id"])
    if scanner.found:
        _remove_image(client, image_id)
    return image_id, scanner.found


def _remove_image(client: docker.DockerClient, image_id: str) -> None:
    with contextlib.suppress(docker.errors.DockerException):
        client.api.remove_image(image_id, force=True)


def scan_changes(
    client: docker.DockerClient, container_id: str, scanner: SecretScanner, changes: list[dict[str, Any]]
) -> None:
    """Scan each path the setup added or changed in the container layer (module doc): from the
    layer's own directory on this host when the engine's overlay2 keeps it here and this process
    may read it (several times faster), else read back through the engine (`get_archive`)."""
    upper = upper_dir(client, container_id)
    if upper is not None:
        for path, read in changed_paths(changes):
            _scan_on_disk(upper, path, read, scanner)
            if scanner.found:
                return
        return
    for path, read in changed_paths(changes):
        scanner.feed_named("a path", path.encode())
        if read and not scanner.found:
            chunks, stat = client.api.get_archive(container_id, path)
            scanner.feed_named("a link", str(stat.get("linkTarget", "")).encode())
            try:
                scanner.feed_stream(chunks)
            finally:
                close = getattr(chunks, "close", None)
                if close is not None:
                    close()
        if scanner.found:
            return


def changed_paths(diff: Iterable[Mapping[str, Any]]) -> Iterator[tuple[str, bool]]:
    """From `container.diff()`: each added or modified path outside the mounts, and whether to read
    its contents. An added path is read once with everything under it (all of it is new), so the
    paths under it are skipped; a modified path that has changes under it is a directory whose
    changed children are listed themselves: only its name counts. Deletions are skipped."""
    changes = {str(entry["Path"]): int(entry["Kind"]) for entry in diff}
    kept = {path: kind for path, kind in changes.items() if not _under_any(path, NOT_COMMITTED) and kind != 2}
    added = {path for path, kind in kept.items() if kind == 1}
    with_children = {str(parent) for path in changes for parent in PurePosixPath(path).parents}
    for path in sorted(kept):
        if any(str(parent) in added for parent in PurePosixPath(path).parents):
            continue
        yield path, path in added or path not in with_children


def _under_any(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root + "/") for root in roots)


def changes_on_disk(upper: Path, limit: int) -> list[dict[str, Any]]:
    """What `container.diff()` would list, read from the layer's own directory (overlay2's upper
    directory holds exactly what the container added or changed): every entry as added (kind 1),
    an overlay whiteout (a 0/0 character device) as deleted (kind 2); at most `limit` entries.
    Several times faster than asking the engine, which walks the same directory."""
    out: list[dict[str, Any]] = []
    for root, dirs, files in os.walk(upper, followlinks=False):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            try:
                info = entry.lstat()
            except OSError:
                continue
            whiteout = stat.S_ISCHR(info.st_mode) and info.st_rdev == 0
            out.append({"Path": "/" + str(entry.relative_to(upper)), "Kind": 2 if whiteout else 1})
            if len(out) >= limit:
                return out
    return out


def upper_dir(client: docker.DockerClient, container_id: str) -> Path | None:
    """The container layer's directory (overlay2's UpperDir) when it is on this host and readable."""
    driver = client.api.inspect_container(container_id).get("GraphDriver") or {}
    upper = (driver.get("Data") or {}).get("UpperDir") if driver.get("Name") == "overlay2" else None
    if not upper or not Path(upper).is_dir() or not os.access(upper, os.R_OK | os.X_OK):
        return None
    return Path(upper)


def _scan_on_disk(upper: Path, path: str, read: bool, scanner: SecretScanner) -> None:
    """`path` of the layer (and, for an added directory, all under it), never following a link the
    setup made: names, link targets and the contents of regular files only (a FIFO or a device is
    never opened)."""
    scanner.feed_named("a path", path.encode())
    if not read:
        return
    top = upper / path.lstrip("/")
    if top.is_symlink() or not top.is_dir():
        _scan_entry(top, scanner)
        return
    for root, dirs, files in os.walk(top, followlinks=False):
        for name in [*dirs, *files]:
            entry = Path(root) / name
            scanner.feed_named("a path", os.fsencode(entry.relative_to(upper)))
            if name in files or entry.is_symlink():
                _scan_entry(entry, scanner)
            if scanner.found:
                return


def _scan_entry(entry: Path, scanner: SecretScanner) -> None:
    try:
        info = entry.lstat()
    except OSError:
        return
    if stat.S_ISLNK(info.st_mode):
        scanner.feed_named("a link", os.fsencode(entry.readlink()))
        return
    if not stat.S_ISREG(info.st_mode):
        return
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        scanner.feed_stream(iter(lambda: f.read(1 << 20), b""))
