"""The train spec's ``validation`` block. (Stub: fields are completed by the validation work.)"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ValidationConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    before_training: bool = False
    every_steps: int = Field(20, ge=0)
