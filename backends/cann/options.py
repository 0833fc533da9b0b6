"""CANN writer options (``kiln compile --emit cann --cann-schema ...``), in ``backend_options["cann"]``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from compiler.errors import OptionError

__all__ = ["CannOptions", "SCHEMAS", "cann_options"]

SCHEMAS = ("ge", "domi")


@dataclass(frozen=True)
class CannOptions:
    """How the ``.om`` file encodes its MODEL_DEF partition.

    Attributes:
        schema: ``ge`` (default): a ``ge.proto.ModelDef`` graph, what ATC, GE's loader and
            Netron read; ``domi``: the seed's legacy ``domi.ModelDef`` (see schemas/cann/README.md).
    """

    schema: str = "ge"

    def __post_init__(self) -> None:
        if self.schema not in SCHEMAS:
            raise OptionError(f"--cann-schema {self.schema!r}: choose from {', '.join(SCHEMAS)}")

    def manifest_view(self) -> dict[str, Any]:
        """The options as recorded in the manifest."""
        return asdict(self)


def cann_options(options: Any) -> CannOptions:
    """The CANN options a compile carries (``CompileOptions.backend_options["cann"]``), else the defaults."""
    found = options.backend("cann")
    return found if isinstance(found, CannOptions) else CannOptions()
