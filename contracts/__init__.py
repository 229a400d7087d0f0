"""The run home and the trainer contract, as code: one torch-free, standard-library-only package.

Why here: ``contracts/`` already holds the contract's text (``subprocess-activity.md``) and its JSON
schemas; its code lives beside them, so the text, the schemas and the code of one contract sit in one
folder and change together. It imports nothing of the project and no third-party package, so every
side of the contract can import it: the engine (the runner's exit codes), the workflows (activity ids,
the resume argument), ctl and its UI (paths, displays, ``ctl doctor``'s checkpoint verification, all
without torch), the simulator, tinyllm and any user's trainer (which write it).

One concept per module:

- ``contracts.layout``: every path of a run home (``RunHome``, ``RunDir``, ``step_dir_name``, ...);
- ``contracts.manifest``: the checkpoint manifest (format, digests) and its verification (sha256);
- ``contracts.resume``: which checkpoint a run resumes from (the trainer's rule, the one every display
  predicts with) and which one the workflow hands a segment (``resume_argument``);
- ``contracts.exits``: the exit codes of trainers and of ctl;
- ``contracts.progress``: the progress-line format (format and parse);
- ``contracts.activity_ids``: the activity-id grammar (format and parse).
"""

from __future__ import annotations

from .activity_ids import (
    ActivityId,
    corpus_id,
    eval_id,
    parse_activity_id,
    step_tag,
    train_id,
)
from .exits import (
    EXIT_BAD_INPUT,
    EXIT_CANCELED,
    EXIT_CONTRACT_BROKEN,
    EXIT_DISK_FULL,
    EXIT_FAILED,
    EXIT_LOCKED,
    EXIT_NOT_PROVEN,
    EXIT_OK,
    EXIT_PREEMPTED,
)
from .layout import (
    LATEST,
    MANIFEST,
    RunDir,
    RunHome,
    artifact_dir_name,
    checkpoint_ref,
    parse_step_dir,
    step_dir_name,
)
from .manifest import CheckpointError, manifest_digest, read_manifest, verify_checkpoint
from .resume import (
    Refusal,
    ResumeChoice,
    choose_resume,
    expected_resume,
    list_step_dirs,
    read_latest,
    resume_argument,
)

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CANCELED",
    "EXIT_CONTRACT_BROKEN",
    "EXIT_DISK_FULL",
    "EXIT_FAILED",
    "EXIT_LOCKED",
    "EXIT_NOT_PROVEN",
    "EXIT_OK",
    "EXIT_PREEMPTED",
    "LATEST",
    "MANIFEST",
    "ActivityId",
    "CheckpointError",
    "Refusal",
    "ResumeChoice",
    "RunDir",
    "RunHome",
    "artifact_dir_name",
    "checkpoint_ref",
    "choose_resume",
    "corpus_id",
    "eval_id",
    "expected_resume",
    "list_step_dirs",
    "manifest_digest",
    "parse_activity_id",
    "parse_step_dir",
    "read_latest",
    "read_manifest",
    "resume_argument",
    "step_dir_name",
    "step_tag",
    "train_id",
    "verify_checkpoint",
]
