"""Offline scoring of large question batches: ``trawmem score`` (single process or Ray Data).

``items`` (questions in), ``banks`` (build what a collection lacks, resumably), ``job`` (the
scorer and the single-process driver), ``writer`` (exactly-once JSONL out, and what an output holds), ``ray_runner``
(the same job on Ray Data; optional extra).
"""
from .items import ScoreItem, items_from_conversations, read_questions
from .job import ScoreSpec, Scorer, run_score
from .writer import ResumableJsonl, read_records, summarize_output

__all__ = ["ScoreItem", "ScoreSpec", "Scorer", "ResumableJsonl", "items_from_conversations", "read_questions",
           "read_records", "run_score", "summarize_output"]
