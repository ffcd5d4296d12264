"""``execution:`` in ``corpus.yaml``: where chunk tasks run. Not a policy: output bytes never
depend on it, so it is not hashed into any manifest."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# host:port, ray://host:port, "auto" (the cluster this machine joined) or "local" (start one here)
RAY_ADDRESS = r"^(auto|local|(ray://)?[A-Za-z0-9._-]+:[0-9]{1,5})$"


class Execution(BaseModel):
    """``workers`` local processes (engine ``local``, the default) or a Ray cluster at
    ``address`` (engine ``ray``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    engine: Literal["local", "ray"] = "local"
    workers: Annotated[int, Field(ge=1, le=256)] = 1
    address: Annotated[str, Field(pattern=RAY_ADDRESS)] | None = None

    @model_validator(mode="after")
    def _address_iff_ray(self) -> "Execution":
        if self.engine == "ray" and self.address is None:
            raise ValueError("engine ray needs address: host:port, ray://host:port, auto or local")
        if self.engine == "local" and self.address is not None:
            raise ValueError("address is only for engine ray")
        return self
