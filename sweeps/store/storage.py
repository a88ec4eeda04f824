"""Where a sweep's files live: ``moe_core.location`` (a local folder or object storage, one
API, for every command), plus the HMAC-signed view of a location that only ``sweeps`` has
(:meth:`Location.signed`, ``sweeps.store.signing``).
"""

from __future__ import annotations

from moe_core import location as _location
from moe_core.location import (  # noqa: F401 (re-exported: the sweep's one storage API)
    S3_DEFAULTS,
    STAGING_ENV,
    check_uri,
    is_url,
    join_uri,
    local_form,
    probe,
    publishing,
    staging_dir,
    staging_for,
)
from sweeps.store.signing import signed_filesystem

S3_SETTINGS = tuple(S3_DEFAULTS)
"""The ``UPCYCLE_S3_*`` variables (timeouts, attempts): passed to every worker (no secret)."""


class Location(_location.Location):
    """A ``moe_core.location.Location`` that can also be seen through the signing filesystem."""

    __slots__ = ()

    def signed(self) -> Location:
        """This location through the HMAC-signing filesystem (``sweeps.store.signing``): every file
        written is signed, every file read verified. Local locations stay as they are
        (``sweeps.store.trust`` checks owners and modes there)."""
        if self.is_local or self.fs.type_name.startswith("py::upcycle-signed"):
            return self
        return Location(signed_filesystem(self.fs), self.path, self.uri)
