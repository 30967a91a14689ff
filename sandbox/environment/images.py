"""This instance's environment images on an engine, kept within a bound of disk."""

import contextlib
from collections.abc import Mapping
from typing import Any

import docker
import docker.errors


def prune_images(client: docker.DockerClient, labels: Mapping[str, str], limit_bytes: int, keep: str) -> list[str]:
    """Remove the oldest images carrying every one of `labels` (an instance's environments) while
    what they add to their bases (their own layers: size minus what they share) is over
    `limit_bytes`; never `keep` (the image just built, by tag or id). The ids removed."""
    wanted = dict(labels)
    images = [
        image
        for image in client.df().get("Images") or []
        if all((image.get("Labels") or {}).get(k) == v for k, v in wanted.items())
    ]
    kept = client.api.inspect_image(keep)["Id"]

    def own(image: Mapping[str, Any]) -> int:
        shared = int(image.get("SharedSize") or 0)
        return max(0, int(image.get("Size") or 0) - max(shared, 0))

    total = sum(own(image) for image in images)
    removed: list[str] = []
    # The engine's creation time to the nanosecond (the summary's is in whole seconds: builds a
    # moment apart would tie), RFC 3339 in UTC, so its text sorts as the time does.
    created = {image["Id"]: str(client.api.inspect_image(image["Id"]).get("Created") or "") for image in images}
    for image in sorted(images, key=lambda i: created[i["Id"]]):
        if total <= limit_bytes:
            break
        if image["Id"] == kept:
            continue
        with contextlib.suppress(docker.errors.APIError):
            client.api.remove_image(image["Id"], force=True)
            removed.append(str(image["Id"]))
            total -= own(image)
    return removed
