"""The measured steps and kernels of ``simbatch/data/measured/hardware``, as rows a preset can predict.

Each dataset becomes a frame of measured times (``measured_ms``) with, per row, the physical work at
100 % efficiency (seconds), so that a prediction under any :class:`~.preset.Efficiency` is one
weighted sum (:func:`predict_ms`). The columns are the terms of ``Deployment.device_ms`` times their
counts: ``W`` (weights streamed), ``STEP``/``LAYERS``/``ALLREDUCES`` (how many fixed overheads),
``DEC``/``LIN`` (matrix-multiply FLOPs of decoding sequences / prefill tokens), ``COMM`` (all-reduce
bytes), ``KV`` (KV bytes read), ``ATTN`` (prefill attention FLOPs).

Each row also has what the plain model ``tau0 + beta*x`` needs to be calibrated like a user would,
at short context: ``group`` (one configuration), ``x`` (its batch or token count) and ``short``
(the rows it is calibrated on). The data are the copies shipped in ``simbatch/data/measured/hardware``
(their README gives the sources), so the fit and its tests run the same anywhere.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from simbatch.hardware.cards import ModelCard, shipped
from simbatch.hardware.preset import Deployment, Efficiency

DATA = Path(str(resources.files("simbatch").joinpath("data/measured/hardware")))
"""The shipped copies of ``../shared/data/hardware`` (simbatch/data/measured/README.md)."""
SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"
"""``../shared/data`` beside the repository, where the originals are (absent in a clone elsewhere)."""

TERMS = ("W", "GW", "STEP", "LAYERS", "ALLREDUCES", "EAGER_ALLREDUCES", "DEC", "LIN", "COMM", "KV", "ATTN")

TRT_GPUS = {"A100-SXM4-80GB": "A100-80GB", "H100 80GB HBM3": "H100-SXM", "H100 NVL": "H100-NVL",
            "H200 141GB HBM3": "H200", "L40": "L40", "L40S": "L40S"}  # GH200: no card (its memory varies)
TRT_MODELS = {"LLaMA v2 7B": "llama-2-7b", "LLaMA v2 13B": "llama-2-13b", "LLaMA v2 70B": "llama-2-70b",
              "Mistral 7B": "mistral-7b", "Mixtral 8x7B": "mixtral-8x7b", "GPTJ 6B": "gpt-j-6b"}  # Falcon: no card
SPLITWISE_GPUS = {"a100-80gb": "A100-80GB", "h100-80gb": "H100-SXM"}  # h100-80gb-pcap: power-capped
VIDUR_GPUS = {"a100": "A100-80GB", "h100": "H100-SXM", "a40": "A40"}
VIDUR_MODELS = {"Llama-2-7b-hf": "llama-2-7b", "Llama-2-70b-hf": "llama-2-70b", "Meta-Llama-3-8B": "llama-3.1-8b",
                "Meta-Llama-3-70B": "llama-3.1-70b", "CodeLlama-34b-Instruct-hf": "codellama-34b",
                "Qwen-72B": "qwen-72b"}


def _deployment(model: str, gpu: str, tp: int = 1, fp8: bool = False) -> Deployment:
    gpus, models = shipped()
    return Deployment(models[model], gpus[gpu], tp, fp8)


def experts_read(d: Deployment, tokens) -> np.ndarray:
    """The expected distinct routed experts a GPU reads for a step of ``tokens`` tokens, per layer
    (simbatch/model/cost.py): ``L (1 - (1 - k/E)^(T dp))``; 0 for a dense model."""
    m = d.model
    if not m.is_moe:
        return np.zeros_like(np.asarray(tokens, dtype=float))
    miss = 1 - m.experts_per_token / m.num_experts
    return d.local_experts * (1 - miss ** (np.asarray(tokens, dtype=float) * d.dp))


def _step_terms(d: Deployment, B, P, K, A, experts=None) -> dict[str, np.ndarray]:
    """A whole engine step of B decodes, P prefill tokens, K KV tokens read, A prefill pairs; ``experts``
    the routed experts read per layer, when not those real routing gives (:func:`experts_read`)."""
    u = d.unit_seconds()
    one = np.ones_like(np.asarray(B, dtype=float))
    read = experts_read(d, B + P) if experts is None else one * experts
    weights = "GW" if d.gpu.memory_kind == "gddr" else "W"
    return {weights: one * u["W"] + read * u["EXPERT"], "STEP": one, "LAYERS": one * u["LAYERS"],
            "ALLREDUCES": one * u["ALLREDUCES"], "DEC": B * u["DEC"], "LIN": P * u["LIN"], "COMM": (B + P) * u["COMM"],
            "KV": K * u["KV"] + B * u["SEQ_KV"], "ATTN": A * u["ATTN"] + P * u["TOK_ATTN"]}


def _rows(meta: pd.DataFrame, terms: dict[str, np.ndarray], eager: bool = False) -> pd.DataFrame:
    if eager:
        terms = {**terms, "EAGER_ALLREDUCES": terms["ALLREDUCES"], "ALLREDUCES": 0.0}
    out = meta.reset_index(drop=True).copy()
    for t in TERMS:
        out[t] = np.asarray(terms.get(t, np.zeros(len(out))), dtype=float) * np.ones(len(out))
    return out


def trtllm(folder: Path = DATA) -> pd.DataFrame:
    """TensorRT-LLM 0.9 static batches: the mean decode step (``t2t_ms``) and the batch's prefill (``ttft_ms``).

    Its Mixtral steps read two experts' weights at any batch: 7.2 ms at batch 16 on two H100s, where the
    eight experts real routing reaches by then (99 % of them) could not stream in less than 14 ms. The
    benchmark's synthetic weights route every token to the same two; its Mixtral rows are read so.
    """
    raw = pd.read_csv(folder / "trtllm090_static_batch.csv")
    raw = raw[raw.gpu.isin(TRT_GPUS) & raw.model.isin(TRT_MODELS) & raw.pp.eq(1)]
    frames = []
    for (gpu, model, prec, tp), g in raw.groupby(["gpu", "model", "precision", "tp"], sort=True):
        d = _deployment(TRT_MODELS[model], TRT_GPUS[gpu], int(tp), prec == "FP8")
        B, isl, osl = g.batch.to_numpy(float), g.isl.to_numpy(float), g.osl.to_numpy(float)
        label = d.name
        same_experts = d.model.experts_per_token if d.model.is_moe else None
        dec = pd.DataFrame({"dataset": "trtllm090_static_batch", "kind": "decode step", "group": label,
                            "x": B, "short": (isl == 128) & (osl == 128), "measured_ms": g.t2t_ms.to_numpy(),
                            "context": isl + osl / 2})
        frames.append(_rows(dec, _step_terms(d, B, 0 * B, B * (isl + osl / 2), 0 * B, same_experts)))
        pre = pd.DataFrame({"dataset": "trtllm090_static_batch", "kind": "prefill", "group": label,
                            "x": B * isl, "short": isl == 128, "measured_ms": g.ttft_ms.to_numpy(), "context": isl})
        frames.append(_rows(pre, _step_terms(d, 0 * B, B * isl, 0 * B, B * isl**2 / 2, same_experts)))
    return pd.concat(frames, ignore_index=True).dropna(subset=["measured_ms"])


def splitwise(folder: Path = DATA) -> pd.DataFrame:
    """Splitwise's Llama-2-70B medians: mean decode step (``token_time_ms``) and prefill (``prompt_time_ms``).

    Rows whose end-to-end time disagrees with prefill + tokens x step by more than 10 % are dropped
    (the dataset's README: early stops). Its all-reduces are an eager engine's (2023: NCCL calls launched
    one by one, no CUDA graphs), several times TensorRT-LLM's: they are costed at their own latency
    (``EAGER_ALLREDUCES``), which the presets, modelling vLLM's captured all-reduce kernels, do not use.
    """
    raw = pd.read_csv(folder / "splitwise_perf_model_medians.csv")
    raw = raw[raw.model.eq("llama2-70b") & raw.hardware.isin(SPLITWISE_GPUS)]
    whole = raw.prompt_time_ms + raw.token_size * raw.token_time_ms
    raw = raw[(whole - raw.e2e_ms).abs() <= 0.1 * raw.e2e_ms]
    frames = []
    for (hw, tp), g in raw.groupby(["hardware", "tensor_parallel"], sort=True):
        d = _deployment("llama-2-70b", SPLITWISE_GPUS[hw], int(tp))
        B, p, o = g.batch_size.to_numpy(float), g.prompt_size.to_numpy(float), g.token_size.to_numpy(float)
        short = p == p.min()
        dec = pd.DataFrame({"dataset": "splitwise_perf_model_medians", "kind": "decode step", "group": d.name,
                            "x": B, "short": short, "measured_ms": g.token_time_ms.to_numpy(), "context": p + o / 2})
        frames.append(_rows(dec, _step_terms(d, B, 0 * B, B * (p + o / 2), 0 * B), eager=True))
        pre = pd.DataFrame({"dataset": "splitwise_perf_model_medians", "kind": "prefill", "group": d.name,
                            "x": B * p, "short": short, "measured_ms": g.prompt_time_ms.to_numpy(), "context": p})
        frames.append(_rows(pre, _step_terms(d, 0 * B, B * p, 0 * B, B * p**2 / 2), eager=True))
    return pd.concat(frames, ignore_index=True)


def vidur(folder: Path = DATA) -> pd.DataFrame:
    """Vidur's linear operators of one iteration vs tokens: weights streamed plus matrix multiplies."""
    raw = pd.read_csv(folder / "vidur_linear_ops_per_iteration.csv")
    raw = raw[raw.gpu.isin(VIDUR_GPUS) & raw.model.isin(VIDUR_MODELS)]
    frames = []
    for (gpu, model, tp), g in raw.groupby(["gpu", "model", "tp"], sort=True):
        d = _deployment(VIDUR_MODELS[model], VIDUR_GPUS[gpu], int(tp))
        n = g.num_tokens.to_numpy(float)
        meta = pd.DataFrame({"dataset": "vidur_linear_ops_per_iteration", "kind": "linear layers", "group": d.name,
                             "x": n, "short": n <= 128, "measured_ms": g.t_lin_ms.to_numpy(), "context": 0.0})
        t = _step_terms(d, 0 * n, n, 0 * n, 0 * n)
        frames.append(_rows(meta, {k: t[k] for k in ("W", "GW", "LIN") if k in t}))
    return pd.concat(frames, ignore_index=True)


def _h100_layer(q: int, kv: int, hd: int, tp: int = 1) -> dict[str, float]:
    """One attention layer of this head layout on an H100, as :meth:`Deployment.unit_seconds` gives it."""
    layer = ModelCard(name=f"{q}-{kv}-{hd}", params_b=1, layers=1, hidden_size=q * hd, intermediate_size=1,
                      q_heads=q, kv_heads=kv, head_dim=hd, vocab_size=1)
    return Deployment(layer, shipped()[0]["H100-SXM"], tp).unit_seconds()


def blis_decode(folder: Path = DATA) -> pd.DataFrame:
    """One layer's decode attention on an H100 vs batch and KV length (the warm-up shot of each sweep dropped)."""
    raw = pd.read_csv(folder / "blis_h100_attention_decode_kernels.csv")
    frames = []
    for (q, kv, hd, tp), g in raw.groupby(["q_heads", "kv_heads", "head_dim", "tp"], sort=False):
        g = g.iloc[1:]
        kv_s = _h100_layer(q, kv, hd, tp)["KV"]
        B, L = g.batch_size.to_numpy(float), g.kv_len.to_numpy(float)
        meta = pd.DataFrame({"dataset": "blis_h100_attention_decode_kernels", "kind": "attention kernel",
                             "group": f"{q}-{kv}-{hd}/tp{tp}", "x": B, "short": L <= 1024,
                             "measured_ms": g.latency_us.to_numpy() / 1e3, "context": L})
        frames.append(_rows(meta, {"LAYERS": 1.0, "KV": B * L * kv_s}))
    return pd.concat(frames, ignore_index=True)


def blis_prefill(folder: Path = DATA) -> pd.DataFrame:
    """One layer's prefill attention on an H100 vs sequence length."""
    raw = pd.read_csv(folder / "blis_h100_attention_prefill_kernels.csv")
    frames = []
    for (q, kv, hd), g in raw.groupby(["q_heads", "kv_heads", "head_dim"], sort=False):
        pair_s = _h100_layer(q, kv, hd)["ATTN"]
        S = g.seq_len.to_numpy(float)
        meta = pd.DataFrame({"dataset": "blis_h100_attention_prefill_kernels", "kind": "attention kernel",
                             "group": f"{q}-{kv}-{hd}", "x": S, "short": S <= 4096,
                             "measured_ms": g.latency_us.to_numpy() / 1e3, "context": S})
        frames.append(_rows(meta, {"LAYERS": 1.0, "ATTN": S**2 / 2 * pair_s}))
    return pd.concat(frames, ignore_index=True)


def blis_gemm(folder: Path = DATA) -> pd.DataFrame:
    """GEMM kernels on an H100: an (m x k) by (k x n) product streams k n weights and does 2 m k n FLOPs.

    Read as fp8 (1-byte weights, the fp8 peak): the largest products run at 1.2 PFLOP/s, beyond the
    bf16 dense peak, and the file's ``mfu`` column implies a 1979 TFLOP/s peak, the fp8 one.
    """
    raw = pd.read_csv(folder / "blis_h100_gemm_kernels.csv")
    gpu = shipped()[0]["H100-SXM"]
    m, k, n = (raw[c].to_numpy(float) for c in ("m", "k", "n"))
    meta = pd.DataFrame({"dataset": "blis_h100_gemm_kernels", "kind": "matrix multiply",
                         "group": [f"{a:.0f}x{b:.0f}" for a, b in zip(k, n, strict=True)], "x": m, "short": m <= 128,
                         "measured_ms": raw.latency_us.to_numpy() / 1e3, "context": 0.0})
    return _rows(meta, {"W": k * n / (gpu.memory_bandwidth_gb_s * 1e9),
                        "LIN": 2 * m * k * n / (gpu.fp8_tflops * 1e12)})


LOADERS = (trtllm, splitwise, vidur, blis_decode, blis_prefill, blis_gemm)


def load_all(folder: Path = DATA) -> pd.DataFrame:
    """Every dataset's rows, in one frame (FileNotFoundError naming the folder when it is absent)."""
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: the measured data are not there; simbatch ships them in "
                                "simbatch/data/measured/hardware")
    return pd.concat([load(folder) for load in LOADERS], ignore_index=True)


def predict_ms(rows: pd.DataFrame, eff: Efficiency) -> np.ndarray:
    """Each row's time under ``eff``, ms (the decode roofline, :meth:`Efficiency.step_seconds`)."""
    return 1e3 * eff.step_seconds(**{t: rows[t].to_numpy() for t in TERMS})


def _per_group(rows: pd.DataFrame, design, calibrate_on) -> np.ndarray:
    """Each row's time under a model fitted per configuration (least relative squares, coefficients >= 0).

    ``design(frame)`` gives the model's columns, ``calibrate_on(frame)`` the rows it is fitted to."""
    out = np.full(len(rows), np.nan)
    for _, idx in rows.groupby(["dataset", "kind", "group"], sort=False).indices.items():
        g = rows.iloc[idx]
        cal = calibrate_on(g)
        if not cal.any():
            continue
        X = design(g)
        X = X[:, np.abs(X[cal.to_numpy()]).sum(axis=0) > 0]
        y = g.measured_ms.to_numpy(float)[cal.to_numpy()]
        coef = nnls(X[cal.to_numpy()] / y[:, None], np.ones_like(y))[0]  # relative error, as calibrate fits
        out[idx] = X @ coef
    return out


def plain_ms(rows: pd.DataFrame) -> np.ndarray:
    """Each row's time under ``tau0 + beta*x`` fitted to its configuration's short rows: today's model,
    calibrated as one would at short context (``x`` the batch, or the prefill tokens)."""
    return _per_group(rows, lambda g: np.column_stack([np.ones(len(g)), g.x.to_numpy(float)]), lambda g: g.short)


def fitted_ms(rows: pd.DataFrame) -> np.ndarray:
    """Each row's time under the five-cost model fitted to all its configuration's rows (as
    ``simbatch calibrate`` fits per-step data): a constant, and the B, P, K and A terms."""
    return _per_group(rows, lambda g: np.column_stack([np.ones(len(g)), *(g[t].to_numpy(float)
                                                                         for t in ("DEC", "LIN", "KV", "ATTN"))]),
                      lambda g: g.measured_ms.notna())


# --------------------------------------------------------------------------- one GPU's own kernels
LAYER_PROFILES = {"RTX-4090": ("llama-3.1-8b", "llmservingsim_rtx4090_llama31_8b"),
                  "RTX-PRO-6000": ("llama-3.1-8b", "llmservingsim_rtxpro6000_llama31_8b")}
"""GPUs whose card carries ``measured_efficiency``: the model profiled on it, and the profile's files
(``<stem>_dense.csv``, ``<stem>_per_sequence.csv``, ``<stem>_attention_decode.csv``: vLLM's modules timed
one by one, one decoder layer)."""
_GEMMS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
_PER_TOKEN = {"act_fn": 1, "layernorm": 2, "rotary_emb": 1}  # a decoder layer runs two RMSNorms
KV_BOUND_TOKENS = 65_536
"""Decode attention reading at least this many KV tokens (64 sequences of 1k) is bound by the KV's stream."""


def layer_profile_fractions(gpu: str, folder: Path = DATA) -> dict[str, float]:
    """The fractions of ``gpu``'s peaks its vLLM kernels reach, from a profile of one decoder layer's
    modules vs tokens (the GPU's entry in :data:`LAYER_PROFILES`), as the preset's terms count the work
    (:meth:`Deployment.unit_seconds`): the weights' stream is the layers' four matrix multiplies and
    the output head at 1-16 tokens, where they are bound by memory (the median of those rows), over the
    weights a step streams; a prompt token's matrix multiplies, norms and activations are the median
    time per token from 1024 tokens on, where the multiplies are bound by compute, over its FLOPs; the
    KV's stream is decode attention's time where it reads at least :data:`KV_BOUND_TOKENS` KV tokens
    (the median of those rows, each batch of ``n_decode`` sequences of ``kv_decode`` tokens), over the
    bf16 KV those tokens hold in one layer."""
    model, stem = LAYER_PROFILES[gpu]
    d = _deployment(model, gpu)
    u, layers = d.unit_seconds(), d.model.layers
    dense = pd.read_csv(folder / f"{stem}_dense.csv").pivot_table(index="tokens", columns="layer", values="time_us")
    head = pd.read_csv(folder / f"{stem}_per_sequence.csv").query("layer == 'lm_head'").set_index("sequences").time_us
    stream_us = layers * dense.loc[1:16, list(_GEMMS)].sum(axis=1).median() + head.loc[1:16].median()
    per_token = dense[list(_GEMMS)].sum(axis=1) + sum(n * dense[k] for k, n in _PER_TOKEN.items())
    token_us = layers * (per_token / per_token.index).loc[1024:].median()
    attn = pd.read_csv(folder / f"{stem}_attention_decode.csv").query("prefill_chunk == 0 and kv_prefill == 0")
    kv_tokens = attn.n_decode * attn.kv_decode
    bound = kv_tokens >= KV_BOUND_TOKENS
    kv_s_per_token = u["KV"] / d.model.full_attention_layers
    weights = "gddr_weights_bandwidth" if d.gpu.memory_kind == "gddr" else "weights_bandwidth"
    return {weights: u["W"] / (stream_us * 1e-6), "linear_flops": u["LIN"] / (token_us * 1e-6),
            "kv_bandwidth": float((kv_tokens[bound] * kv_s_per_token / (attn.time_us[bound] * 1e-6)).median())}
