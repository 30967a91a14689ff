"""The running version (from the installed distribution)."""

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("forgehand")
except PackageNotFoundError:  # running from a source tree that was not installed
    VERSION = "0.0.0"
