"""`--suite lm-eval:TASK[,TASK...]`: lm-evaluation-harness tasks as paired kvqual samples.

lm-eval runs the task against one target through its own `local-completions` (or
`local-chat-completions`) model pointed at the target's base URL, with per-sample logging;
each logged doc becomes a `Sample` keyed by (`lm-eval:<task>`, str(doc_id), 0), so two
targets pair by document id. No tokenizer is downloaded (`tokenizer_backend=None`,
`tokenized_requests=False`), and the Hugging Face hub and datasets run offline: a data set
that is not local or cached fails at once with a SuiteError instead of hanging.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

from kvqual.errors import InfrastructureError, KvqualError, SuiteError
from kvqual.records import Sample, SuiteRef

__all__ = ["PREFIX", "parse_suite_spec", "run_lmeval", "samples_from_logged", "SHIPPED_TASKS_DIR"]

PREFIX = "lm-eval:"
# The offline task shipped with the repository (suites/lm-eval/, task `kvqual_arith`).
SHIPPED_TASKS_DIR = Path(__file__).resolve().parents[3] / "suites" / "lm-eval"


def parse_suite_spec(spec: str) -> list[str]:
    """`lm-eval:a,b` → ["a", "b"]; raises SuiteError when no task is named."""
    if not spec.startswith(PREFIX):
        raise SuiteError(spec, None, f"an lm-eval suite is written {PREFIX}TASK[,TASK...]")
    tasks = [t.strip() for t in spec[len(PREFIX):].split(",") if t.strip()]
    if not tasks:
        raise SuiteError(spec, None, "no lm-eval task named")
    return tasks


def _go_offline() -> None:
    """Make the hub and datasets read only the local cache (before and after their import)."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        os.environ.setdefault(var, "1")
    try:
        import datasets.config
        import huggingface_hub.constants

        datasets.config.HF_DATASETS_OFFLINE = os.environ["HF_DATASETS_OFFLINE"] == "1"
        huggingface_hub.constants.HF_HUB_OFFLINE = os.environ["HF_HUB_OFFLINE"] == "1"
    except ImportError:  # pragma: no cover - both come with lm-eval
        pass


def _response_text(logged: Mapping[str, Any], output_type: str) -> str | None:
    """The model's answer for one doc: generated text, or the chosen option's index."""
    resps = logged.get("resps") or []
    if output_type == "generate_until":
        first = resps[0] if resps else None
        while isinstance(first, (list, tuple)) and first:
            first = first[0]
        return first if isinstance(first, str) else None
    if not resps:
        return None
    try:  # loglikelihood / multiple_choice: resps[i] == [(logprob, is_greedy)]
        scores = [float(r[0][0]) for r in resps]
    except (TypeError, IndexError, ValueError):
        return None
    return str(max(range(len(scores)), key=scores.__getitem__))


def samples_from_logged(task: str, logged: Iterable[Mapping[str, Any]], *, output_type: str,
                        metric: str, base_url: str | None = None) -> list[Sample]:
    """lm-eval's per-sample log (one filter) → kvqual Samples paired by doc id."""
    out: list[Sample] = []
    filters_seen: str | None = None
    for row in logged:
        filter_key = row.get("filter")
        filters_seen = filters_seen if filters_seen is not None else filter_key
        if filter_key != filters_seen:
            continue  # lm-eval logs each doc once per filter; keep the first filter
        text = _response_text(row, output_type)
        value = row.get(metric)
        score = float(value) if isinstance(value, (int, float)) else None
        error = None if text is not None else "lm-eval recorded no response for this doc"
        out.append(Sample(id=str(row["doc_id"]), suite=PREFIX + task, repeat=0,
                          text=text, finish_reason=None, completion_tokens=None, error=error,
                          score=score if error is None else None, base_url=base_url))
    return out


def _suite_ref(task: str, yaml_path: str | None, logged: list[Mapping[str, Any]]) -> SuiteRef:
    """Name, source and a content hash of the task YAML plus the docs it served."""
    h = hashlib.sha256()
    if yaml_path and Path(yaml_path).is_file():
        h.update(Path(yaml_path).read_bytes())
    for row in sorted(logged, key=lambda r: int(r["doc_id"])):
        h.update(str(row["doc_id"]).encode() + b"\0" + str(row.get("doc_hash", "")).encode())
    n = len({row["doc_id"] for row in logged})
    return SuiteRef(name=PREFIX + task, source=yaml_path or "lm-eval", sha256=h.hexdigest(), n_items=n)


def _load_tasks(tasks: list[str], include_path: str | None) -> tuple[Any, dict[str, Any]]:
    """TaskManager + loaded Task objects; unknown tasks and missing data → SuiteError."""
    from lm_eval.tasks import TaskManager, get_task_dict

    paths = [str(SHIPPED_TASKS_DIR)] if SHIPPED_TASKS_DIR.is_dir() else []
    if include_path:
        if not Path(include_path).is_dir():
            raise SuiteError(include_path, None, "--include-path is not a folder")
        paths.insert(0, include_path)
    # Index only the given folders when they hold every task (indexing lm-eval's own
    # thousands of YAML files takes ~20 s); otherwise include lm-eval's built-in tasks.
    manager = TaskManager(include_path=paths or None, include_defaults=not paths)
    if paths and not set(tasks) <= set(manager.all_tasks):
        manager = TaskManager(include_path=paths)
    known = set(manager.all_tasks)
    for task in tasks:
        if task not in known:
            raise SuiteError(PREFIX + task, None, "lm-eval knows no such task "
                             "(check the name, or pass --include-path with its YAML folder)")
    try:
        if hasattr(manager, "load"):  # newer lm-eval (0.4.13 here): every leaf task by name; get_task_dict deprecated
            task_dict = dict(manager.load(tasks)["tasks"])
        else:
            task_dict = get_task_dict(tasks, manager)
    except Exception as exc:  # datasets raises many types for missing / uncached data
        raise SuiteError(PREFIX + ",".join(tasks), None,
                         f"could not load the task data offline ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0] if str(exc) else ''}); put the data set "
                         "in the local datasets cache or point the task at local files") from None
    return manager, task_dict


def run_lmeval(tasks: list[str], *, base_url: str, model: str, limit: int | None = None,
               include_path: str | None = None, api_key: str | None = None,
               concurrency: int = 4, chat: bool = False, max_gen_toks: int = 256,
               timeout_s: int = 300, tokenizer: str | None = None,
               ) -> tuple[list[SuiteRef], list[Sample]]:
    """Run lm-eval `tasks` against one OpenAI-compatible target (`base_url` = the /v1 root).

    Without `tokenizer` (a local Hugging Face tokenizer folder or a cached name) only
    generate_until tasks work: lm-eval needs token counts to score loglikelihood tasks.
    """
    _go_offline()
    import lm_eval

    manager, task_dict = _load_tasks(tasks, include_path)
    if tokenizer is None:
        needs_tokens = [t for t, obj in task_dict.items() if obj.OUTPUT_TYPE != "generate_until"]
        if needs_tokens:
            raise SuiteError(PREFIX + ",".join(needs_tokens), None, "loglikelihood tasks need a "
                             "tokenizer (pass one); only generate_until tasks run without")
    endpoint = "chat/completions" if chat else "completions"
    model_args = {
        "model": model, "base_url": f"{base_url.rstrip('/')}/{endpoint}",
        "tokenizer_backend": "huggingface" if tokenizer else None, "tokenizer": tokenizer,
        "tokenized_requests": False,
        "num_concurrent": max(1, concurrency), "max_retries": 3, "timeout": timeout_s,
        "max_gen_toks": max_gen_toks, "header": {"Authorization": f"Bearer {api_key or 'EMPTY'}"},
    }
    try:
        results = lm_eval.simple_evaluate(
            model="local-chat-completions" if chat else "local-completions",
            model_args=model_args, tasks=list(task_dict.values()), limit=limit,
            log_samples=True, task_manager=manager, apply_chat_template=chat,
            bootstrap_iters=0, random_seed=0, numpy_random_seed=1234,
            torch_random_seed=1234, fewshot_random_seed=1234,
        )
    except ModuleNotFoundError as exc:  # lm-eval's API models need its [api] extra
        raise KvqualError(f"lm-eval cannot talk to APIs here: {exc}") from None
    except Exception as exc:  # aiohttp/requests/tenacity errors: the target did not answer
        raise InfrastructureError(f"lm-eval against {base_url} failed: {type(exc).__name__}: "
                                  f"{str(exc).splitlines()[0] if str(exc) else ''}") from exc
    if results is None:
        raise InfrastructureError("lm-eval returned no results")
    refs: list[SuiteRef] = []
    samples: list[Sample] = []
    for task in tasks:
        logged = list(results.get("samples", {}).get(task, []))
        task_obj = task_dict[task]
        metric_list = task_obj.config.metric_list or [{"metric": (logged[0]["metrics"][0] if logged else "acc")}]
        metric = metric_list[0]["metric"]
        metric = metric if isinstance(metric, str) else getattr(metric, "__name__", str(metric))
        entry = manager.task_index.get(task)
        yaml_path = getattr(entry, "yaml_path", None) if entry is not None else None
        refs.append(_suite_ref(task, str(yaml_path) if yaml_path else None, logged))
        samples += samples_from_logged(task, logged, output_type=task_obj.OUTPUT_TYPE,
                                       metric=metric, base_url=base_url)
    return refs, samples

