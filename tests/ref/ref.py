#!/usr/bin/python3
"""ref: a deliberately plain float64 reference forward pass for Llama-family GGUF models.

Independent of the C engine: its own GGUF parser (v2/v3, every metadata type,
nested arrays), dequantizers for F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS (vectorized over blocks, in
float64 from the stored values: exact), and a full-sequence
forward pass (no KV cache) for the `llama` (with Llama 3 `rope_freqs`
factors, linear RoPE scaling and `attention.key_length` heads), `qwen2` and
`qwen3` architectures, written from the Hugging Face modelling code
(Qwen3Attention normalizes each head of q and k with its own RMSNorm before
the rotary embedding, and has no q/k/v biases), and `gemma2` (Gemma2Model:
embeddings times sqrt(hidden), RMSNorm with (1 + w), post-attention and
post-feed-forward norms, gelu_pytorch_tanh gate, tanh soft-capping of the
attention scores and the final logits, a sliding window on even layers) and
`gemma3` (Gemma3TextModel: no soft-caps, q/k RMSNorm with (1 + w) per head,
sliding layers all but every 6th, with rope_local_base_freq 10000 unscaled)
and `phi3` (Phi3Model: fused qkv_proj and gate_up_proj, LongRoPE inv_freq
divided by the short factors within the original context, sliding window).
Mixtures of experts (MixtralSparseMoeBlock for `llama` with expert_count,
Qwen2MoeSparseMoeBlock for `qwen2moe`, Qwen3MoeSparseMoeBlock for
`qwen3moe`): softmax over every router logit, the top k, renormalised to sum
1 for Mixtral and Qwen3-MoE (norm_topk_prob) but not Qwen2-MoE, whose
shared expert is added times sigmoid(shared_expert_gate . x).
YaRN RoPE scaling (llama, qwen2, qwen3) follows the YaRN paper (Peng et al.
2023) as Hugging Face's `_compute_yarn_parameters` computes it: beta_fast 32,
beta_slow 1, a linear ramp over the correction range between the
interpolated and the extrapolated frequencies, cos and sin times
0.1 ln(factor) + 1 (times the GGUF's rope.scaling.attn_factor).

CLI:  ref.py MODEL.gguf --ids 1,2,3 [--out FILE] [--greedy N] [--ctx N]
(--ctx: the context the model runs with; Phi-3's long factors apply above the
original context, as llama.cpp decides; without it, above the sequence length
as Hugging Face decides)
prints (or writes) the logits of every position, one line per position.
"""

import argparse
import struct
import sys

import numpy as np

# ---------------------------------------------------------------- GGUF parser

VT_UINT8, VT_INT8, VT_UINT16, VT_INT16, VT_UINT32, VT_INT32, VT_FLOAT32, \
    VT_BOOL, VT_STRING, VT_ARRAY, VT_UINT64, VT_INT64, VT_FLOAT64 = range(13)

_SCALAR = {
    VT_UINT8: "<B", VT_INT8: "<b", VT_UINT16: "<H", VT_INT16: "<h",
    VT_UINT32: "<I", VT_INT32: "<i", VT_FLOAT32: "<f", VT_BOOL: "<?",
    VT_UINT64: "<Q", VT_INT64: "<q", VT_FLOAT64: "<d",
}

T_F32, T_F16, T_Q8_0, T_BF16 = 0, 1, 8, 30
T_Q4_0, T_Q4_1, T_Q5_0, T_Q5_1 = 2, 3, 6, 7
T_Q2_K, T_Q3_K, T_Q4_K, T_Q5_K, T_Q6_K = 10, 11, 12, 13, 14
T_IQ4_NL, T_IQ4_XS = 20, 23

# type -> (elements per block, bytes per block)
_TTYPES = {T_F32: (1, 4), T_F16: (1, 2), T_Q8_0: (32, 34), T_BF16: (1, 2),
           T_Q4_0: (32, 18), T_Q4_1: (32, 20), T_Q5_0: (32, 22), T_Q5_1: (32, 24),
           T_Q2_K: (256, 84), T_Q3_K: (256, 110), T_Q4_K: (256, 144), T_Q5_K: (256, 176),
           T_Q6_K: (256, 210), T_IQ4_NL: (32, 18), T_IQ4_XS: (256, 136)}


class GGUFError(Exception):
    pass


class _Reader:
    def __init__(self, buf):
        self.buf = buf
        self.pos = 0

    def take(self, n):
        if n < 0 or self.pos + n > len(self.buf):
            raise GGUFError("truncated file at offset %d" % self.pos)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def scalar(self, fmt):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self):
        n = self.scalar("<Q")
        return bytes(self.take(n)).decode("utf-8", errors="surrogateescape")

    def value(self, vtype):
        if vtype in _SCALAR:
            return self.scalar(_SCALAR[vtype])
        if vtype == VT_STRING:
            return self.string()
        if vtype == VT_ARRAY:
            etype = self.scalar("<I")
            n = self.scalar("<Q")
            return [self.value(etype) for _ in range(n)]
        raise GGUFError("unknown metadata value type %d" % vtype)


class GGUF:
    """A parsed GGUF file: version, kv (dict), tensors (dict name -> info)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = memoryview(f.read())
        r = _Reader(self.buf)
        if bytes(r.take(4)) != b"GGUF":
            raise GGUFError("%s: bad magic" % path)
        self.version = r.scalar("<I")
        if self.version not in (2, 3):
            raise GGUFError("%s: unsupported version %d" % (path, self.version))
        n_tensors = r.scalar("<Q")
        n_kv = r.scalar("<Q")
        self.kv = {}
        for _ in range(n_kv):
            key = r.string()
            vtype = r.scalar("<I")
            self.kv[key] = r.value(vtype)
        self.tensors = {}
        self.tensor_order = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.scalar("<I")
            ne = [r.scalar("<Q") for _ in range(n_dims)]
            ttype = r.scalar("<I")
            offset = r.scalar("<Q")
            self.tensors[name] = {"ne": ne, "type": ttype, "offset": offset}
            self.tensor_order.append(name)
        self.alignment = int(self.kv.get("general.alignment", 32))
        self.data_offset = (r.pos + self.alignment - 1) // self.alignment * self.alignment

    def tensor(self, name):
        """Dequantized tensor as float64, numpy shape = reversed GGUF ne
        (so a GGUF [n_in, n_out] weight comes back as (n_out, n_in))."""
        info = self.tensors[name]
        ne, ttype = info["ne"], info["type"]
        if ttype not in _TTYPES:
            raise GGUFError("tensor %s: unsupported type %d" % (name, ttype))
        n = 1
        for d in ne:
            n *= d
        blck, bsize = _TTYPES[ttype]
        if n % blck:
            raise GGUFError("tensor %s: %d elements not a whole number of blocks" % (name, n))
        nbytes = n // blck * bsize
        start = self.data_offset + info["offset"]
        if start + nbytes > len(self.buf):
            raise GGUFError("tensor %s: data past end of file" % name)
        raw = self.buf[start:start + nbytes]
        x = dequantize(ttype, raw, n)
        return x.reshape(tuple(reversed(ne)) if ne else ())


# ---------------------------------------------------------------- block dequantizers
# Each takes the blocks as a structured array and returns (n_blocks, block)
# float64 values. Nibbles: low halves first, then high halves.

IQ4_GRID = np.array([-127, -104, -83, -65, -49, -35, -22, -10,
                     1, 13, 25, 38, 53, 69, 89, 113], dtype=np.float64)


def _f(a):
    return a.astype(np.float64)


def _nibbles(qs):
    """(nb, k) bytes -> (nb, 2k) values: all low nibbles, then all high ones."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.int64)


def _bits32(qh):
    """(nb, 4) bytes -> (nb, 32) bits, bit j of the little-endian word at j."""
    return np.unpackbits(qh, axis=1, bitorder="little").astype(np.int64)


def _dq_q4_0(b):
    return _f(b["d"])[:, None] * (_nibbles(b["qs"]) - 8)


def _dq_q4_1(b):
    return _f(b["d"])[:, None] * _nibbles(b["qs"]) + _f(b["m"])[:, None]


def _dq_q5_0(b):
    return _f(b["d"])[:, None] * ((_nibbles(b["qs"]) | _bits32(b["qh"]) << 4) - 16)


def _dq_q5_1(b):
    return _f(b["d"])[:, None] * (_nibbles(b["qs"]) | _bits32(b["qh"]) << 4) + _f(b["m"])[:, None]


def _dq_iq4_nl(b):
    return _f(b["d"])[:, None] * IQ4_GRID[_nibbles(b["qs"])]


def _crumbs(qs):
    """(nb, 64) bytes of 2-bit fields -> (nb, 256): in each 32-byte half,
    bits 0-1 of all 32 bytes, then bits 2-3, 4-5, 6-7."""
    q = qs.reshape(-1, 2, 1, 32).astype(np.int64)
    return ((q >> (2 * np.arange(4))[None, None, :, None]) & 3).reshape(-1, 256)


def _dq_q2_k(b):
    sc = _f(b["scales"] & 15)
    mn = _f(b["scales"] >> 4)
    q = _crumbs(b["qs"]).reshape(-1, 16, 16)
    y = _f(b["d"])[:, None, None] * sc[:, :, None] * q - _f(b["dmin"])[:, None, None] * mn[:, :, None]
    return y.reshape(-1, 256)


def _dq_q3_k(b):
    s = b["scales"].astype(np.int64)
    i = np.arange(16)
    low = np.where(i < 8, s[:, i % 8] & 15, s[:, i % 8] >> 4)
    high = (s[:, 8 + i % 4] >> (2 * (i // 4))) & 3
    sc = _f((low | high << 4) - 32)
    # high bit of element 128n + 32k + l: bit 4n + k of hmask[l]
    hm = b["hmask"].astype(np.int64)[:, None, None, :]
    shift = (4 * np.arange(2)[:, None] + np.arange(4)[None, :])[None, :, :, None]
    hbit = ((hm >> shift) & 1).reshape(-1, 256)
    q = (_crumbs(b["qs"]) - 4 * (1 - hbit)).reshape(-1, 16, 16)
    return (_f(b["d"])[:, None, None] * sc[:, :, None] * q).reshape(-1, 256)


def _k4_scales(s):
    """(nb, 12) bytes -> (scales, mins), (nb, 8) each, six bits a value."""
    s = s.astype(np.int64)
    sc = np.empty((s.shape[0], 8), dtype=np.int64)
    mn = np.empty_like(sc)
    sc[:, :4] = s[:, 0:4] & 63
    mn[:, :4] = s[:, 4:8] & 63
    sc[:, 4:] = (s[:, 8:12] & 15) | (s[:, 0:4] >> 6) << 4
    mn[:, 4:] = (s[:, 8:12] >> 4) | (s[:, 4:8] >> 6) << 4
    return _f(sc), _f(mn)


def _k4_values(qs):
    """(nb, 128) bytes -> (nb, 256): per 32 bytes, low nibbles then high."""
    q = qs.reshape(-1, 4, 1, 32).astype(np.int64)
    return ((q >> np.array([0, 4])[None, None, :, None]) & 15).reshape(-1, 256)


def _dq_q4_k(b, q=None):
    sc, mn = _k4_scales(b["scales"])
    if q is None:
        q = _k4_values(b["qs"])
    q = q.reshape(-1, 8, 32)
    y = _f(b["d"])[:, None, None] * sc[:, :, None] * q - _f(b["dmin"])[:, None, None] * mn[:, :, None]
    return y.reshape(-1, 256)


def _dq_q5_k(b):
    # bit 4 of element 64c + 32h + l: bit 2c + h of qh[l]
    qh = b["qh"].astype(np.int64)[:, None, None, :]
    hbit = ((qh >> (2 * np.arange(4)[:, None] + np.arange(2)[None, :])[None, :, :, None]) & 1)
    return _dq_q4_k(b, _k4_values(b["qs"]) | hbit.reshape(-1, 256) << 4)


def _dq_q6_k(b):
    ql = b["ql"].astype(np.int64).reshape(-1, 2, 2, 32)   # (nb, half, which 32, l)
    qh = b["qh"].astype(np.int64).reshape(-1, 2, 1, 32)   # (nb, half, 1, l)
    # element 32g + l of a half: nibble g // 2 of ql[32 (g % 2) + l], bits 2g of qh[l]
    g = np.arange(4)
    lo = (ql[:, :, g % 2, :] >> (4 * (g // 2))[None, None, :, None]) & 15
    hi = (qh >> (2 * g)[None, None, :, None]) & 3
    q = ((lo | hi << 4) - 32).reshape(-1, 16, 16)
    sc = _f(b["scales"])
    return (_f(b["d"])[:, None, None] * sc[:, :, None] * q).reshape(-1, 256)


def _dq_iq4_xs(b):
    sl = b["scales_l"].astype(np.int64)
    sh = b["scales_h"].astype(np.int64)[:, None]
    s = np.arange(8)
    ls = ((sl[:, s // 2] >> (4 * (s % 2))) & 15) | ((sh >> (2 * s)) & 3) << 4
    q = IQ4_GRID[_nibbles(b["qs"].reshape(-1, 16)).reshape(-1, 8, 32)]
    return (_f(b["d"])[:, None, None] * _f(ls - 32)[:, :, None] * q).reshape(-1, 256)


_F2 = "<f2"
_BLOCKS = {
    T_Q4_0: ([("d", _F2), ("qs", "u1", (16,))], _dq_q4_0),
    T_Q4_1: ([("d", _F2), ("m", _F2), ("qs", "u1", (16,))], _dq_q4_1),
    T_Q5_0: ([("d", _F2), ("qh", "u1", (4,)), ("qs", "u1", (16,))], _dq_q5_0),
    T_Q5_1: ([("d", _F2), ("m", _F2), ("qh", "u1", (4,)), ("qs", "u1", (16,))], _dq_q5_1),
    T_IQ4_NL: ([("d", _F2), ("qs", "u1", (16,))], _dq_iq4_nl),
    T_Q2_K: ([("scales", "u1", (16,)), ("qs", "u1", (64,)), ("d", _F2), ("dmin", _F2)], _dq_q2_k),
    T_Q3_K: ([("hmask", "u1", (32,)), ("qs", "u1", (64,)), ("scales", "u1", (12,)), ("d", _F2)],
             _dq_q3_k),
    T_Q4_K: ([("d", _F2), ("dmin", _F2), ("scales", "u1", (12,)), ("qs", "u1", (128,))], _dq_q4_k),
    T_Q5_K: ([("d", _F2), ("dmin", _F2), ("scales", "u1", (12,)), ("qh", "u1", (32,)),
              ("qs", "u1", (128,))], _dq_q5_k),
    T_Q6_K: ([("ql", "u1", (128,)), ("qh", "u1", (64,)), ("scales", "i1", (16,)), ("d", _F2)],
             _dq_q6_k),
    T_IQ4_XS: ([("d", _F2), ("scales_h", "<u2"), ("scales_l", "u1", (4,)), ("qs", "u1", (128,))],
               _dq_iq4_xs),
}


def dequantize(ttype, raw, n):
    """Bytes of n elements of the given ggml type -> float64 vector."""
    if ttype in _BLOCKS:
        fields, fn = _BLOCKS[ttype]
        blck, bsize = _TTYPES[ttype]
        dt = np.dtype(fields)
        assert dt.itemsize == bsize, (ttype, dt.itemsize)
        blocks = np.frombuffer(raw, dtype=dt, count=n // blck)
        return fn(blocks).reshape(n)
    if ttype == T_F32:
        return np.frombuffer(raw, dtype="<f4", count=n).astype(np.float64)
    if ttype == T_F16:
        return np.frombuffer(raw, dtype="<f2", count=n).astype(np.float64)
    if ttype == T_BF16:
        u = np.frombuffer(raw, dtype="<u2", count=n).astype(np.uint32) << 16
        return u.view(np.float32).astype(np.float64)
    if ttype == T_Q8_0:
        blocks = np.frombuffer(raw, dtype=np.dtype([("d", "<f2"), ("qs", "i1", (32,))]),
                               count=n // 32)
        d = blocks["d"].astype(np.float64)[:, None]
        return (d * blocks["qs"].astype(np.float64)).reshape(n)
    raise GGUFError("unsupported tensor type %d" % ttype)


# ---------------------------------------------------------------- model

class Model:
    """Hyperparameters and dequantized float64 weights of a llama/qwen2 GGUF."""

    def __init__(self, path, ctx=None):
        g = GGUF(path)
        self.ctx = ctx
        self.gguf = g
        arch = g.kv.get("general.architecture")
        if arch not in ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe",
                        "qwen3moe"):
            raise GGUFError("%s: unsupported architecture %r" % (path, arch))
        self.arch = arch

        def hp(key, default=None):
            v = g.kv.get("%s.%s" % (arch, key), default)
            if v is None:
                raise GGUFError("%s: missing %s.%s" % (path, arch, key))
            return v

        self.dim = int(hp("embedding_length"))
        self.n_layers = int(hp("block_count"))
        self.n_heads = int(hp("attention.head_count"))
        self.n_kv_heads = int(hp("attention.head_count_kv", self.n_heads))
        self.head_dim = int(hp("attention.key_length", self.dim // self.n_heads))
        if int(hp("attention.value_length", self.head_dim)) != self.head_dim:
            raise GGUFError("%s: value_length != key_length" % path)
        self.rope_dim = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.eps = float(hp("attention.layer_norm_rms_epsilon", 1e-5))
        self.neox = arch in ("qwen2", "qwen3", "gemma2", "gemma3", "phi3", "qwen2moe",
                             "qwen3moe")
        self.n_expert = int(hp("expert_count", 0))
        self.n_expert_used = int(hp("expert_used_count", 0))
        self.norm_topk = arch in ("llama", "qwen3moe")
        if arch == "phi3":
            self.window = int(hp("attention.sliding_window"))
            self.orig_ctx = int(hp("rope.scaling.original_context_length",
                                   hp("context_length", 4096)))
        if arch == "gemma3":
            # Gemma3TextConfig: sliding_window_pattern 6, rope_local_base_freq
            # 10000; no soft-caps; query_pre_attn_scalar as for gemma2 (27B: 62 layers)
            self.attn_cap = self.final_cap = 0.0
            self.window = int(hp("attention.sliding_window"))
            self.query_pre_attn_scalar = (self.dim // self.n_heads if self.n_layers == 62
                                          else self.head_dim)
            self.swa_pattern, self.local_base = 6, 10000.0
        if arch == "gemma2":
            self.swa_pattern, self.local_base = 2, None
            # Gemma2Config: attn_logit_softcapping, final_logit_softcapping,
            # sliding_window; query_pre_attn_scalar is not in the GGUF: head_dim,
            # or hidden/heads for the 46-layer 27B (as llama.cpp c392e50 decides)
            self.attn_cap = float(hp("attn_logit_softcapping", 50.0))
            self.final_cap = float(hp("final_logit_softcapping", 30.0))
            self.window = int(hp("attention.sliding_window", 4096))
            self.query_pre_attn_scalar = (self.dim // self.n_heads if self.n_layers == 46
                                          else self.head_dim)
        # HF rope_scaling "linear": positions divided by the factor
        stype = g.kv.get("%s.rope.scaling.type" % arch, "linear")
        factor = float(g.kv.get("%s.rope.scaling.factor" % arch, 0.0) or 1.0)
        if arch == "phi3" and stype == "longrope":
            stype = "none"                                 # the factors are tensors
        if stype not in ("none", "linear", "yarn"):
            raise GGUFError("%s: rope scaling %r not implemented" % (path, stype))
        if stype == "yarn" and arch not in ("llama", "qwen2", "qwen3"):
            raise GGUFError("%s: yarn for %s not implemented here" % (path, arch))
        self.pos_scale = 1.0 / factor if stype == "linear" else 1.0
        self.mscale = float(g.kv.get("%s.rope.scaling.attn_factor" % arch, 1.0))
        self.inv_freq = None
        if stype == "yarn":
            orig = int(hp("rope.scaling.original_context_length", hp("context_length", 2048)))
            self.inv_freq = yarn_inv_freq(self.rope_dim, self.rope_base, factor, orig)
            self.mscale *= 0.1 * np.log(factor) + 1.0 if factor > 1.0 else 1.0
        used = set()

        def t(name):
            used.add(name)
            return g.tensor(name)
        # HF rope_type "llama3" as the GGUF carries it: divisors of inv_freq
        self.rope_freqs = t("rope_freqs.weight") if "rope_freqs.weight" in g.tensors else None
        if "rope_factors_short.weight" in g.tensors:       # Phi-3 LongRoPE ext_factors
            self.rope_short = t("rope_factors_short.weight")
            self.rope_long = t("rope_factors_long.weight")
        else:
            self.rope_short = self.rope_long = None
        self.tok_embd = t("token_embd.weight")             # (vocab, dim)
        self.n_vocab = self.tok_embd.shape[0]
        self.out_norm = t("output_norm.weight")            # (dim,)
        if "output.weight" in g.tensors and arch != "gemma2":  # gemma2 always ties
            self.output = t("output.weight")               # (vocab, dim)
        else:
            self.output = self.tok_embd                    # tied
        self.layers = []
        for i in range(self.n_layers):
            p = "blk.%d." % i
            if arch == "phi3":                             # qkv_proj, gate_up_proj
                nq, nkv = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
                qkv = t(p + "attn_qkv.weight")
                gu = t(p + "ffn_up.weight")
                ff = gu.shape[0] // 2
                L = {"wq": qkv[:nq], "wk": qkv[nq:nq + nkv], "wv": qkv[nq + nkv:],
                     "w_gate": gu[:ff], "w_up": gu[ff:]}
            else:
                L = {"wq": t(p + "attn_q.weight"),         # (heads*hd, dim)
                     "wk": t(p + "attn_k.weight"),         # (kv_heads*hd, dim)
                     "wv": t(p + "attn_v.weight")}         # (kv_heads*hd, dim)
            if self.n_expert:
                L.update({"router": t(p + "ffn_gate_inp.weight"),       # (experts, dim)
                          "e_gate": t(p + "ffn_gate_exps.weight"),      # (experts, ff, dim)
                          "e_up": t(p + "ffn_up_exps.weight"),          # (experts, ff, dim)
                          "e_down": t(p + "ffn_down_exps.weight")})     # (experts, dim, ff)
                if arch == "qwen2moe":
                    L.update({"sh_gate_inp": t(p + "ffn_gate_inp_shexp.weight"),  # (dim,)
                              "sh_gate": t(p + "ffn_gate_shexp.weight"),
                              "sh_up": t(p + "ffn_up_shexp.weight"),
                              "sh_down": t(p + "ffn_down_shexp.weight")})
            elif arch != "phi3":
                L.update({"w_gate": t(p + "ffn_gate.weight"),  # (ff, dim)
                          "w_up": t(p + "ffn_up.weight")})     # (ff, dim)
            L.update({
                "attn_norm": t(p + "attn_norm.weight"),    # (dim,)
                "wo": t(p + "attn_output.weight"),         # (dim, heads*hd)
                "ffn_norm": t(p + "ffn_norm.weight"),      # (dim,)
            })
            if not self.n_expert:
                L["w_down"] = t(p + "ffn_down.weight")     # (dim, ff)
            for b in ("q", "k", "v"):
                name = p + "attn_%s.bias" % b
                L["b" + b] = t(name) if name in g.tensors else None
            for b in ("q", "k"):                           # qwen3: (hd,) per-head norms
                name = p + "attn_%s_norm.weight" % b
                L[b + "_norm"] = t(name) if arch in ("qwen3", "gemma3", "qwen3moe") else None
            if arch in ("gemma2", "gemma3"):               # (dim,) each
                L["post_attn_norm"] = t(p + "post_attention_norm.weight")
                L["post_ffn_norm"] = t(p + "post_ffw_norm.weight")
            self.layers.append(L)
        left = [n for n in g.tensor_order if n not in used]
        if left:
            raise GGUFError("%s: tensors not understood: %s" % (path, ", ".join(left[:4])))


def rmsnorm(x, w, eps):
    """x: (T, dim) -> x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def yarn_inv_freq(dim, base, factor, orig_ctx, beta_fast=32.0, beta_slow=1.0):
    """YaRN's per-pair inverse frequencies (dim/2,): the interpolated ones
    (divided by factor) for the low-frequency pairs, the original ones for the
    high-frequency pairs, a linear ramp between the correction dims at which
    a pair turns beta_fast and beta_slow times over the original context."""
    def corr_dim(rotations):
        return dim * np.log(orig_ctx / (rotations * 2 * np.pi)) / (2 * np.log(base))
    low = max(np.floor(corr_dim(beta_fast)), 0)
    high = min(np.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1.0 - ramp                              # weight of the original frequency
    pos_freqs = base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation


def rope(x, pos, rope_dim, base, neox, freq_div=None, mscale=1.0, inv_freq=None):
    """Rotate the first rope_dim dims of every head. x: (T, heads, hd);
    pos may be fractional (linear scaling); freq_div divides each pair's
    frequency (Llama 3 factors); mscale multiplies cos and sin (Phi-3
    LongRoPE's scaling_factor, rope.scaling.attn_factor, YaRN's); inv_freq
    replaces base^(-2i/rope_dim) (YaRN)."""
    x = x.copy()
    half = rope_dim // 2
    i = np.arange(half, dtype=np.float64)
    theta = base ** (-2.0 * i / rope_dim) if inv_freq is None else inv_freq  # (half,)
    if freq_div is not None:
        theta = theta / freq_div
    ang = pos[:, None].astype(np.float64) * theta[None, :]  # (T, half)
    cos = np.cos(ang)[:, None, :] * mscale
    sin = np.sin(ang)[:, None, :] * mscale
    if neox:
        a = x[:, :, 0:half].copy()
        b = x[:, :, half:rope_dim].copy()
        x[:, :, 0:half] = a * cos - b * sin
        x[:, :, half:rope_dim] = a * sin + b * cos
    else:
        a = x[:, :, 0:rope_dim:2].copy()
        b = x[:, :, 1:rope_dim:2].copy()
        x[:, :, 0:rope_dim:2] = a * cos - b * sin
        x[:, :, 1:rope_dim:2] = a * sin + b * cos
    return x


def silu(x):
    return x / (1.0 + np.exp(-x))


def moe_ffn(m, L, h):
    """The sparse MoE block of h (T, dim): each token's top-k experts by
    softmax(router), weights renormalised where the family does, plus the
    qwen2moe shared expert times sigmoid(its gate)."""
    logits = h @ L["router"].T                             # (T, experts)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = p / p.sum(axis=1, keepdims=True)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        top = np.argsort(-p[t], kind="stable")[:m.n_expert_used]
        w = p[t, top]
        if m.norm_topk:
            w = w / w.sum()
        for e, we in zip(top, w):
            f = silu(L["e_gate"][e] @ h[t]) * (L["e_up"][e] @ h[t])
            out[t] += we * (L["e_down"][e] @ f)
    if "sh_gate" in L:
        g = 1.0 / (1.0 + np.exp(-(h @ L["sh_gate_inp"])))   # (T,)
        f = silu(h @ L["sh_gate"].T) * (h @ L["sh_up"].T)
        out += g[:, None] * (f @ L["sh_down"].T)
    return out


def gemma_norm(x, w_gguf, eps):
    """Gemma2RMSNorm: x / sqrt(mean(x^2) + eps) * (1 + w). The GGUF converter
    stores 1 + w, so w = stored - 1."""
    w = w_gguf - 1.0
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * (1.0 + w)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def forward_gemma(m, ids):
    """Gemma2Model / Gemma3TextModel + lm_head, eager attention, float64: (T, n_vocab)."""
    T = len(ids)
    hd, nh, nkv = m.head_dim, m.n_heads, m.n_kv_heads
    pos = np.arange(T)
    qpos, kpos = pos[:, None], pos[None, :]
    causal = np.where(kpos > qpos, -np.inf, 0.0)
    sliding = np.where((kpos > qpos) | (qpos - kpos >= m.window), -np.inf, 0.0)
    h = m.tok_embd[ids] * np.sqrt(m.dim)                   # normalizer = hidden_size ** 0.5
    for li, L in enumerate(m.layers):
        is_sliding = bool((li + 1) % m.swa_pattern)        # gemma2: not layer_idx % 2
        residual = h
        x = gemma_norm(h, L["attn_norm"], m.eps)           # input_layernorm
        q = (x @ L["wq"].T).reshape(T, nh, hd)
        k = (x @ L["wk"].T).reshape(T, nkv, hd)
        v = (x @ L["wv"].T).reshape(T, nkv, hd)
        if L["q_norm"] is not None:                        # gemma3 q_norm / k_norm
            q = gemma_norm(q, L["q_norm"], m.eps)
            k = gemma_norm(k, L["k_norm"], m.eps)
        if is_sliding and m.local_base:                    # rotary_emb_local: unscaled
            q = rope(q, pos, m.rope_dim, m.local_base, True)
            k = rope(k, pos, m.rope_dim, m.local_base, True)
        else:
            q = rope(q, pos * m.pos_scale, m.rope_dim, m.rope_base, True)
            k = rope(k, pos * m.pos_scale, m.rope_dim, m.rope_base, True)
        mask = sliding if is_sliding else causal
        out = np.zeros((T, nh, hd))
        for hq in range(nh):
            hk = hq // (nh // nkv)                         # repeat_kv
            s = (q[:, hq, :] @ k[:, hk, :].T) * m.query_pre_attn_scalar ** -0.5
            if m.attn_cap > 0:
                s = np.tanh(s / m.attn_cap) * m.attn_cap
            s = s + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hq, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, hk, :]
        x = out.reshape(T, nh * hd) @ L["wo"].T            # o_proj
        h = residual + gemma_norm(x, L["post_attn_norm"], m.eps)
        residual = h
        x = gemma_norm(h, L["ffn_norm"], m.eps)            # pre_feedforward_layernorm
        x = (gelu_tanh(x @ L["w_gate"].T) * (x @ L["w_up"].T)) @ L["w_down"].T
        h = residual + gemma_norm(x, L["post_ffn_norm"], m.eps)
    logits = gemma_norm(h, m.out_norm, m.eps) @ m.output.T
    if m.final_cap > 0:
        logits = np.tanh(logits / m.final_cap) * m.final_cap
    return logits


def forward_phi3(m, ids):
    """Phi3Model + lm_head, eager attention, float64: (T, n_vocab)."""
    T = len(ids)
    hd, nh, nkv = m.head_dim, m.n_heads, m.n_kv_heads
    pos = np.arange(T)
    qpos, kpos = pos[:, None], pos[None, :]
    mask = np.where((kpos > qpos) | (qpos - kpos >= m.window if m.window else False), -np.inf, 0.0)
    ext = None
    if m.rope_short is not None:
        ext = m.rope_long if (m.ctx or T) > m.orig_ctx else m.rope_short
    h = m.tok_embd[ids].copy()
    for L in m.layers:
        x = rmsnorm(h, L["attn_norm"], m.eps)
        q = rope((x @ L["wq"].T).reshape(T, nh, hd), pos, m.rope_dim, m.rope_base, True, ext,
                 m.mscale)
        k = rope((x @ L["wk"].T).reshape(T, nkv, hd), pos, m.rope_dim, m.rope_base, True, ext,
                 m.mscale)
        v = (x @ L["wv"].T).reshape(T, nkv, hd)
        out = np.zeros((T, nh, hd))
        for hq in range(nh):
            hk = hq // (nh // nkv)
            s = q[:, hq, :] @ k[:, hk, :].T / np.sqrt(hd) + mask
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, hq, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, hk, :]
        h = h + out.reshape(T, nh * hd) @ L["wo"].T
        x = rmsnorm(h, L["ffn_norm"], m.eps)
        h = h + (silu(x @ L["w_gate"].T) * (x @ L["w_up"].T)) @ L["w_down"].T
    return rmsnorm(h, m.out_norm, m.eps) @ m.output.T


def forward(m, ids):
    """Logits for every position of the token sequence ids: (T, n_vocab), float64."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    if T == 0:
        return np.zeros((0, m.n_vocab))
    if ids.min() < 0 or ids.max() >= m.n_vocab:
        raise ValueError("token id out of range")
    if m.arch in ("gemma2", "gemma3"):
        return forward_gemma(m, ids)
    if m.arch == "phi3":
        return forward_phi3(m, ids)
    hd, nh, nkv = m.head_dim, m.n_heads, m.n_kv_heads
    group = nh // nkv
    pos = np.arange(T) * m.pos_scale
    mask = np.triu(np.full((T, T), -np.inf), k=1)          # causal
    x = m.tok_embd[ids].copy()                             # (T, dim)
    for L in m.layers:
        h = rmsnorm(x, L["attn_norm"], m.eps)
        q = h @ L["wq"].T
        k = h @ L["wk"].T
        v = h @ L["wv"].T
        if L["bq"] is not None:
            q = q + L["bq"]
        if L["bk"] is not None:
            k = k + L["bk"]
        if L["bv"] is not None:
            v = v + L["bv"]
        q = q.reshape(T, nh, hd)
        k = k.reshape(T, nkv, hd)
        if L["q_norm"] is not None:
            q = rmsnorm(q, L["q_norm"], m.eps)
            k = rmsnorm(k, L["k_norm"], m.eps)
        q = rope(q, pos, m.rope_dim, m.rope_base, m.neox, m.rope_freqs, m.mscale, m.inv_freq)
        k = rope(k, pos, m.rope_dim, m.rope_base, m.neox, m.rope_freqs, m.mscale, m.inv_freq)
        v = v.reshape(T, nkv, hd)
        att_out = np.zeros((T, nh, hd))
        for hq in range(nh):
            hk = hq // group
            s = q[:, hq, :] @ k[:, hk, :].T / np.sqrt(hd) + mask   # (T, T)
            s = s - s.max(axis=1, keepdims=True)
            p = np.exp(s)
            p = p / p.sum(axis=1, keepdims=True)
            att_out[:, hq, :] = p @ v[:, hk, :]
        x = x + att_out.reshape(T, nh * hd) @ L["wo"].T
        h = rmsnorm(x, L["ffn_norm"], m.eps)
        if m.n_expert:
            x = x + moe_ffn(m, L, h)
            continue
        f = silu(h @ L["w_gate"].T) * (h @ L["w_up"].T)
        x = x + f @ L["w_down"].T
    x = rmsnorm(x, m.out_norm, m.eps)
    return x @ m.output.T


def greedy(m, ids, n):
    """n greedy (argmax) continuation ids of the prompt ids."""
    seq = list(ids)
    out = []
    for _ in range(n):
        nxt = int(np.argmax(forward(m, seq)[-1]))
        out.append(nxt)
        seq.append(nxt)
    return out


# ---------------------------------------------------------------- CLI

def main(argv):
    ap = argparse.ArgumentParser(description="float64 reference forward pass for GGUF llama/qwen2/qwen3/gemma2/gemma3/phi3")
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write logits here instead of stdout")
    ap.add_argument("--greedy", type=int, default=0,
                    help="also print N greedy continuation ids to stderr")
    ap.add_argument("--ctx", type=int, default=None,
                    help="the context the model runs with (Phi-3 long/short RoPE factors)")
    a = ap.parse_args(argv)
    ids = [int(s) for s in a.ids.split(",") if s.strip()]
    m = Model(a.model, a.ctx)
    logits = forward(m, ids)
    lines = "".join(" ".join("%.9g" % v for v in row) + "\n" for row in logits)
    if a.out:
        with open(a.out, "w") as f:
            f.write(lines)
    else:
        sys.stdout.write(lines)
    if a.greedy > 0:
        sys.stderr.write("greedy: %s\n" % ",".join(str(i) for i in greedy(m, ids, a.greedy)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
