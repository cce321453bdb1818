"""The base of the `/fleet/*` response models (`engine/api/`): built from the fleet's and the
store's dicts, they keep fields they do not name, so a field added there is passed on, never dropped."""

from pydantic import BaseModel, ConfigDict


class OpenModel(BaseModel):
    model_config = ConfigDict(extra="allow")
