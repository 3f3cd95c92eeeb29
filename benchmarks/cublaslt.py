"""cuBLASLt through ctypes, for benchmarks/cublaslt_search.py: y = x W^T with an algorithm chosen by timing the
candidates cuBLASLt's heuristic offers, instead of taking its first guess (what torch's F.linear runs). Not used by
the engine: on an H200 the best candidate matched torch's pick at decode rows (results/2026-12-03-h200-cublaslt*).

torch ships libcublasLt and loads it with libtorch_cuda, so this needs nothing built: the calls go to the library
already in the process. The algorithm descriptor (cublasLtMatmulAlgo_t, 64 bytes) is plain data that stays valid
for the same library version, so a tuned choice can be kept per (GPU, cuBLASLt version, shape).

Layout: torch row-major y[M, N] = x[M, K] @ W[N, K]^T is column-major D[N, M] = op(A)[N, K] @ B[K, M] with
A = W (K x N, ld = K, transposed), B = x (K x M, ld = x.stride(0)), D = y (N x M, ld = N).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_COMPUTE_32F = 68
DESC_TRANSA, DESC_TRANSB = 3, 4
PREF_MAX_WORKSPACE_BYTES = 1
OP_N, OP_T = 0, 1
WORKSPACE_BYTES = 32 * 2**20
DTYPES = {torch.bfloat16: CUDA_R_16BF, torch.float16: CUDA_R_16F, torch.float32: CUDA_R_32F}
# cublasLtMatmulAlgoConfigAttributes_t: what a descriptor says about its kernel
CONFIG_ATTRS = {"algo_id": 0, "tile": 1, "split_k": 2, "reduction": 3, "swizzle": 4, "custom": 5, "stages": 6,
                "inner_shape": 7, "cluster": 8}


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


def _library() -> ctypes.CDLL:
    """The libcublasLt torch loaded (found in the process's mappings), else the first soname that loads."""
    torch.cuda.init()
    try:
        with open("/proc/self/maps") as f:
            paths = sorted({line.split()[-1] for line in f if "libcublasLt.so" in line})
    except OSError:
        paths = []
    for name in paths + ["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("cuBLASLt: no libcublasLt in this process or on the library path")


def _declare(lib: ctypes.CDLL) -> None:
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    sigs = {
        "cublasLtCreate": [ctypes.POINTER(p)],
        "cublasLtGetVersion": [],
        "cublasLtMatmulDescCreate": [ctypes.POINTER(p), i, i],
        "cublasLtMatmulDescSetAttribute": [p, i, p, sz],
        "cublasLtMatrixLayoutCreate": [ctypes.POINTER(p), i, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int64],
        "cublasLtMatmulPreferenceCreate": [ctypes.POINTER(p)],
        "cublasLtMatmulPreferenceSetAttribute": [p, i, p, sz],
        "cublasLtMatmulAlgoGetHeuristic": [p, p, p, p, p, p, p, i, ctypes.POINTER(HeuristicResult),
                                           ctypes.POINTER(i)],
        "cublasLtMatmulAlgoConfigGetAttribute": [ctypes.POINTER(Algo), i, p, sz, ctypes.POINTER(sz)],
        "cublasLtMatmul": [p, p, p, p, p, p, p, p, p, p, p, p, ctypes.POINTER(Algo), p, sz, p],
    }
    for name, args in sigs.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = ctypes.c_size_t if name == "cublasLtGetVersion" else ctypes.c_int


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"cuBLASLt: {what} failed with status {status}")


@dataclass(frozen=True, slots=True)
class Problem:
    """One GEMM shape: y[m, n] = x[m, k] @ W[n, k]^T, x with row stride ldx."""
    m: int
    n: int
    k: int
    dtype: torch.dtype
    ldx: int


class CublasLt:
    """One handle, matmul descriptor per dtype, layouts per problem and a workspace, for the current device."""

    def __init__(self) -> None:
        self.lib = _library()
        _declare(self.lib)
        self.handle = ctypes.c_void_p()
        _check(self.lib.cublasLtCreate(ctypes.byref(self.handle)), "cublasLtCreate")
        self.version = int(self.lib.cublasLtGetVersion())
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")
        self._descs: dict[torch.dtype, ctypes.c_void_p] = {}
        self._layouts: dict[Problem, tuple[ctypes.c_void_p, ...]] = {}
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(0.0)

    def _desc(self, dtype: torch.dtype) -> ctypes.c_void_p:
        if dtype not in self._descs:
            desc = ctypes.c_void_p()
            _check(self.lib.cublasLtMatmulDescCreate(ctypes.byref(desc), CUBLAS_COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate")
            for attr, op in ((DESC_TRANSA, OP_T), (DESC_TRANSB, OP_N)):
                value = ctypes.c_int32(op)
                _check(self.lib.cublasLtMatmulDescSetAttribute(desc, attr, ctypes.byref(value), 4),
                       "cublasLtMatmulDescSetAttribute")
            self._descs[dtype] = desc
        return self._descs[dtype]

    def _layout(self, rows: int, cols: int, ld: int, dtype: torch.dtype) -> ctypes.c_void_p:
        layout = ctypes.c_void_p()
        _check(self.lib.cublasLtMatrixLayoutCreate(ctypes.byref(layout), DTYPES[dtype], rows, cols, ld),
               "cublasLtMatrixLayoutCreate")
        return layout

    def layouts(self, p: Problem) -> tuple[ctypes.c_void_p, ...]:
        """(A = W, B = x, D = y) descriptors of a problem (C is D: beta is 0)."""
        if p not in self._layouts:
            self._layouts[p] = (self._layout(p.k, p.n, p.k, p.dtype), self._layout(p.k, p.m, p.ldx, p.dtype),
                                self._layout(p.n, p.m, p.n, p.dtype))
        return self._layouts[p]

    def candidates(self, p: Problem, count: int = 64) -> list[HeuristicResult]:
        """The algorithms cuBLASLt's heuristic offers for a problem, in its own order (best guess first)."""
        pref = ctypes.c_void_p()
        _check(self.lib.cublasLtMatmulPreferenceCreate(ctypes.byref(pref)), "cublasLtMatmulPreferenceCreate")
        ws = ctypes.c_uint64(WORKSPACE_BYTES)
        _check(self.lib.cublasLtMatmulPreferenceSetAttribute(pref, PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
               "cublasLtMatmulPreferenceSetAttribute")
        a, b, d = self.layouts(p)
        results = (HeuristicResult * count)()
        returned = ctypes.c_int(0)
        _check(self.lib.cublasLtMatmulAlgoGetHeuristic(self.handle, self._desc(p.dtype), a, b, d, d, pref, count,
                                                       results, ctypes.byref(returned)),
               "cublasLtMatmulAlgoGetHeuristic")
        return [results[i] for i in range(returned.value) if results[i].state == 0]

    def config(self, algo: Algo) -> dict[str, int]:
        """The kernel an algorithm descriptor names: tile and stage ids, split-K, swizzle, cluster shape, ..."""
        out = {}
        for name, attr in CONFIG_ATTRS.items():
            out[name] = -1
            for ctype in (ctypes.c_uint32, ctypes.c_uint16, ctypes.c_uint64):  # each attribute has its own width
                value, written = ctype(0), ctypes.c_size_t(0)
                if self.lib.cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, ctypes.byref(value),
                                                                 ctypes.sizeof(ctype), ctypes.byref(written)) == 0:
                    out[name] = int(value.value)
                    break
        return out

    def matmul(self, x: torch.Tensor, weight: torch.Tensor, algo: Algo, out: torch.Tensor | None = None
               ) -> torch.Tensor:
        """y = x @ weight^T with the given algorithm, on the current stream (graph-capturable)."""
        m, k = x.shape
        n = weight.shape[0]
        p = Problem(m, n, k, x.dtype, x.stride(0))
        a, b, d = self.layouts(p)
        y = out if out is not None else torch.empty(m, n, dtype=x.dtype, device=x.device)
        _check(self.lib.cublasLtMatmul(
            self.handle, self._desc(x.dtype), ctypes.byref(self._alpha), weight.data_ptr(), a, x.data_ptr(), b,
            ctypes.byref(self._beta), y.data_ptr(), d, y.data_ptr(), d, ctypes.byref(algo),
            self.workspace.data_ptr(), WORKSPACE_BYTES, torch.cuda.current_stream().cuda_stream), "cublasLtMatmul")
        return y

