#!/usr/bin/python3
"""ref: a deliberately plain float64 reference forward pass for Llama-family GGUF models.

Independent of the C engine: its own GGUF parser (v2/v3, every metadata type,
nested arrays), dequantizers for F32, F16, BF16 and Q8_0, and a full-sequence
forward pass (no KV cache) for the `llama` and `qwen2` architectures.

CLI:  ref.py MODEL.gguf --ids 1,2,3 [--out FILE] [--greedy N]
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

# type -> (elements per block, bytes per block)
_TTYPES = {T_F32: (1, 4), T_F16: (1, 2), T_Q8_0: (32, 34), T_BF16: (1, 2)}


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


def dequantize(ttype, raw, n):
    """Bytes of n elements of the given ggml type -> float64 vector."""
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

    def __init__(self, path):
        g = GGUF(path)
        self.gguf = g
        arch = g.kv.get("general.architecture")
        if arch not in ("llama", "qwen2"):
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
        self.head_dim = self.dim // self.n_heads
        self.rope_dim = int(hp("rope.dimension_count", self.head_dim))
        self.rope_base = float(hp("rope.freq_base", 10000.0))
        self.eps = float(hp("attention.layer_norm_rms_epsilon", 1e-5))
        self.neox = arch == "qwen2"

        t = g.tensor
        self.tok_embd = t("token_embd.weight")             # (vocab, dim)
        self.n_vocab = self.tok_embd.shape[0]
        self.out_norm = t("output_norm.weight")            # (dim,)
        if "output.weight" in g.tensors:
            self.output = t("output.weight")               # (vocab, dim)
        else:
            self.output = self.tok_embd                    # tied
        self.layers = []
        for i in range(self.n_layers):
            p = "blk.%d." % i
            L = {
                "attn_norm": t(p + "attn_norm.weight"),    # (dim,)
                "wq": t(p + "attn_q.weight"),              # (heads*hd, dim)
                "wk": t(p + "attn_k.weight"),              # (kv_heads*hd, dim)
                "wv": t(p + "attn_v.weight"),              # (kv_heads*hd, dim)
                "wo": t(p + "attn_output.weight"),         # (dim, heads*hd)
                "ffn_norm": t(p + "ffn_norm.weight"),      # (dim,)
                "w_gate": t(p + "ffn_gate.weight"),        # (ff, dim)
                "w_up": t(p + "ffn_up.weight"),            # (ff, dim)
                "w_down": t(p + "ffn_down.weight"),        # (dim, ff)
            }
            for b in ("q", "k", "v"):
                name = p + "attn_%s.bias" % b
                L["b" + b] = t(name) if name in g.tensors else None
            self.layers.append(L)


def rmsnorm(x, w, eps):
    """x: (T, dim) -> x / sqrt(mean(x^2) + eps) * w."""
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, rope_dim, base, neox):
    """Rotate the first rope_dim dims of every head. x: (T, heads, hd)."""
    x = x.copy()
    half = rope_dim // 2
    i = np.arange(half, dtype=np.float64)
    theta = base ** (-2.0 * i / rope_dim)                  # (half,)
    ang = pos[:, None].astype(np.float64) * theta[None, :]  # (T, half)
    cos = np.cos(ang)[:, None, :]
    sin = np.sin(ang)[:, None, :]
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


def forward(m, ids):
    """Logits for every position of the token sequence ids: (T, n_vocab), float64."""
    ids = np.asarray(ids, dtype=np.int64)
    T = len(ids)
    if T == 0:
        return np.zeros((0, m.n_vocab))
    if ids.min() < 0 or ids.max() >= m.n_vocab:
        raise ValueError("token id out of range")
    hd, nh, nkv = m.head_dim, m.n_heads, m.n_kv_heads
    group = nh // nkv
    pos = np.arange(T)
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
        q = rope(q.reshape(T, nh, hd), pos, m.rope_dim, m.rope_base, m.neox)
        k = rope(k.reshape(T, nkv, hd), pos, m.rope_dim, m.rope_base, m.neox)
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
    ap = argparse.ArgumentParser(description="float64 reference forward pass for GGUF llama/qwen2")
    ap.add_argument("model")
    ap.add_argument("--ids", required=True, help="comma-separated token ids")
    ap.add_argument("--out", help="write logits here instead of stdout")
    ap.add_argument("--greedy", type=int, default=0,
                    help="also print N greedy continuation ids to stderr")
    a = ap.parse_args(argv)
    ids = [int(s) for s in a.ids.split(",") if s.strip()]
    m = Model(a.model)
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
