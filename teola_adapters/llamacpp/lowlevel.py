"""A llama.cpp model with one context of several sequences, on llama-cpp-python's low-level API.

    llm = BatchedLlama(llama_cpp, numpy, path, n_ctx=2048, n_seq=5, chunk=32, n_threads=1)
    logits = llm.eval(0, tokens, start=0)              # a prompt in canonical chunks
    rows = llm.step([(0, token, pos), (1, other, pos2)])   # one token for two sequences

Each sequence has its own KV stream (`kv_unified=False`), so a batched row computes bit for
bit what the sequence alone computes; the context parameters are `Llama`'s. Why:
docs/llamacpp-engine.md. All methods but `tokenize`/`detokenize` must run on one thread.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from teola_adapters.llamacpp.loading import load_model

_LOGGER = "llama-cpp-python"  # llama-cpp-python prints llama.cpp's log through this logger
_backend_ready = False


class LlamaCallError(RuntimeError):
    """llama.cpp refused an operation (decode, state restore)."""


class BatchedLlama:
    """A model and a context of `n_seq` sequences of `n_ctx` tokens each (see the module doc)."""

    def __init__(self, lib: Any, np: Any, path: Path, *, n_ctx: int, n_seq: int, chunk: int, n_threads: int) -> None:
        global _backend_ready
        self._lib, self._np = lib, np
        logger = logging.getLogger(_LOGGER)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.ERROR)  # what the high-level class does with verbose=False
        if not _backend_ready:
            lib.llama_backend_init()
            _backend_ready = True
        self.model = load_model(lib, path)
        if not self.model:
            raise LlamaCallError(f"llama.cpp could not load the model {path}")
        self.vocab = lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(lib.llama_vocab_n_tokens(self.vocab))
        self.bos = int(lib.llama_vocab_bos(self.vocab))
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self.n_ctx = n_ctx
        self.n_seq = n_seq
        self.chunk = chunk
        self.n_threads = n_threads
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx * n_seq  # split evenly: n_ctx cells per sequence
        cparams.n_batch = cparams.n_ubatch = max(chunk, n_seq)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = False
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.yarn_ext_factor, cparams.yarn_attn_factor = -1.0, 1.0  # Llama's defaults
        cparams.yarn_beta_fast, cparams.yarn_beta_slow = 32.0, 1.0
        self.ctx = lib.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise LlamaCallError(f"llama.cpp could not create a context of {n_seq} x {n_ctx} tokens")
        self.memory = lib.llama_get_memory(self.ctx)
        self._batch = lib.llama_batch_init(max(chunk, n_seq), 0, 1)
        self._closed = False

    # -- vocabulary (thread-safe: the vocabulary is read-only) ----------------------------
    def tokenize(self, text: bytes) -> list[int]:
        """Tokens as `Llama.tokenize(text, add_bos=True, special=True)` gives them."""
        self._check_open()
        lib = self._lib
        size = len(text) + 2
        buf = (lib.llama_token * size)()
        n = lib.llama_tokenize(self.vocab, text, len(text), buf, size, True, True)
        if n < 0:  # more tokens than bytes + 2 cannot happen with BPE, but llama.cpp says how many
            size = -n
            buf = (lib.llama_token * size)()
            n = lib.llama_tokenize(self.vocab, text, len(text), buf, size, True, True)
        if n < 0:
            raise LlamaCallError(f"llama.cpp could not tokenize {len(text)} bytes")
        return list(buf[:n])

    def detokenize(self, tokens: Sequence[int]) -> bytes:
        """The bytes of the tokens, as `Llama.detokenize` gives them (special tokens render empty)."""
        out = b"".join(self.piece(t) for t in tokens)
        if tokens and tokens[0] == self.bos and out[:1] == b" ":
            out = out[1:]
        return out

    def piece(self, token: int) -> bytes:
        """The token's text (remembered: the vocabulary never changes)."""
        known = self._pieces.get(token)
        if known is not None:
            return known
        self._check_open()
        lib = self._lib
        buf = ctypes.create_string_buffer(64)
        n = lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = lib.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
        piece = self._pieces[token] = bytes(buf.raw[:n])
        return piece

    def is_eog(self, token: int) -> bool:
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(self._lib.llama_vocab_is_eog(self.vocab, token))
        return known

    # -- evaluation (the worker thread) ---------------------------------------------------
    def eval(self, seq: int, tokens: Sequence[int], start: int) -> Any:
        """Evaluate tokens[start:] of sequence `seq` (start on a chunk boundary, the cells
        from `start` on empty) in canonical chunks; return a copy of the last token's logits."""
        if start % self.chunk:
            raise ValueError(f"evaluation must start on a chunk boundary, not at {start}")
        if start >= len(tokens):
            raise ValueError(f"nothing to evaluate: {len(tokens)} tokens from {start}")
        last = 0
        for begin in range(start, len(tokens), self.chunk):
            last = self.eval_chunk(seq, tokens, begin)
        return self.logits(last)

    def eval_chunk(self, seq: int, tokens: Sequence[int], begin: int) -> int:
        """Evaluate the canonical chunk of `tokens` that starts at `begin`; the row of its last token."""
        piece = tokens[begin : begin + self.chunk]
        self._fill([(t, begin + i, seq, i == len(piece) - 1) for i, t in enumerate(piece)])
        self._decode()
        return len(piece) - 1

    def step(self, rows: Sequence[tuple[int, int, int]]) -> list[Any]:
        """One `llama_decode` of (sequence, token, position) rows; each row's logits (copies).

        Two foreign calls a step (each releases and retakes the GIL, which costs most when
        other threads run Python): the decode, and one read of every row's logits.
        """
        self._fill([(token, pos, seq, True) for seq, token, pos in rows])
        self._decode()
        every = self._lib.llama_get_logits(self.ctx)
        return list(self._np.ctypeslib.as_array(every, shape=(len(rows), self.n_vocab)).copy())

    def argmax(self, logits: Any) -> int:
        """The greedy choice: the first token of the highest logit."""
        return int(self._np.argmax(logits))

    def logits(self, i: int) -> Any:
        row = self._lib.llama_get_logits_ith(self.ctx, i)
        return self._np.ctypeslib.as_array(row, shape=(self.n_vocab,)).copy()

    def truncate(self, seq: int, n: int) -> None:
        """Drop the sequence's cells from position n on."""
        self._lib.llama_memory_seq_rm(self.memory, seq, n, -1)

    def save(self, seq: int) -> tuple[Any, int]:
        """The sequence's KV as (ctypes byte array, bytes used)."""
        lib = self._lib
        size = int(lib.llama_state_seq_get_size(self.ctx, seq))
        data = (ctypes.c_uint8 * size)()
        nbytes = int(lib.llama_state_seq_get_data(self.ctx, data, size, seq))
        if nbytes == 0 or nbytes > size:
            raise LlamaCallError(f"saving sequence {seq} wrote {nbytes} of {size} bytes")
        return data, nbytes

    def load(self, seq: int, data: Any, nbytes: int) -> None:
        """Replace the sequence's KV by a saved one (from any sequence)."""
        self.truncate(seq, 0)
        read = int(self._lib.llama_state_seq_set_data(self.ctx, data, nbytes, seq))
        if read != nbytes:
            raise LlamaCallError(f"restoring sequence {seq} read {read} of {nbytes} bytes")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lib = self._lib
        lib.llama_batch_free(self._batch)
        lib.llama_free(self.ctx)
        lib.llama_model_free(self.model)

    def _check_open(self) -> None:
        if self._closed:
            raise LlamaCallError("the model is closed")

    def _fill(self, rows: Sequence[tuple[int, int, int, bool]]) -> None:
        batch = self._batch
        batch.n_tokens = len(rows)
        for i, (token, pos, seq, output) in enumerate(rows):
            batch.token[i] = token
            batch.pos[i] = pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq
            batch.logits[i] = output

    def _decode(self) -> None:
        code = self._lib.llama_decode(self.ctx, self._batch)
        if code != 0:
            raise LlamaCallError(f"llama_decode failed with code {code}")


class Sampler:
    """`Llama.generate`'s sampler chain for one sequence, applied to logits we hold.

    penalties (last 64 tokens) -> top_k -> typical (1.0: off) -> top_p -> min_p -> temperature
    -> a seeded draw: the chain, order and seed use of `Llama.generate` with `temp > 0`.
    """

    def __init__(
        self,
        lib: Any,
        np: Any,
        n_vocab: int,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        repeat_penalty: float,
        seed: int,
    ) -> None:
        self._lib = lib
        self.chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        for sampler in (
            lib.llama_sampler_init_penalties(n_vocab, 64, repeat_penalty, 0.0, 0.0),
            lib.llama_sampler_init_top_k(top_k),
            lib.llama_sampler_init_typical(1.0, 1),
            lib.llama_sampler_init_top_p(top_p, 1),
            lib.llama_sampler_init_min_p(min_p, 1),
            lib.llama_sampler_init_temp(temperature),
            lib.llama_sampler_init_dist(seed & 0xFFFFFFFF),
        ):
            lib.llama_sampler_chain_add(self.chain, sampler)  # the chain owns it
        self._data = (lib.llama_token_data * n_vocab)()
        self._view = np.frombuffer(self._data, dtype=[("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])
        self._ids = np.arange(n_vocab, dtype=np.int32)

    def sample(self, logits: Any) -> int:
        """Draw the next token from the logits (what `llama_sampler_sample` does with a context's)."""
        lib, view = self._lib, self._view
        view["id"] = self._ids
        view["logit"] = logits
        view["p"] = 0.0
        cur = lib.llama_token_data_array(ctypes.cast(self._data, lib.llama_token_data_p), len(view), -1, False)
        lib.llama_sampler_apply(self.chain, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise LlamaCallError("the sampler chain selected no token")
        token = int(cur.data[cur.selected].id)
        lib.llama_sampler_accept(self.chain, token)
        return token

    def close(self) -> None:
        if self.chain is not None:
            self._lib.llama_sampler_free(self.chain)
            self.chain = None
