// evo's native torch operators (built by evo.torch.build_ops with the user's C++ compiler).
//
//   torch.ops.evo_native.mm(a, b)              a @ b
//   torch.ops.evo_native.linear(x, w, bias)    F.linear(x, w, bias)
//   torch.ops.evo_native.linear_prepared(x, w, wpad, bias)
//                                              F.linear(x, w, bias), B read from wpad: w padded once
//                                              (N x ldb, zeros past K), through the export's
//                                              launcher for a B padded once where the table has one
//
// Exact-shape dispatch: a CUDA call whose (M, N, K, layout) is in the table that
// evo.torch.register fills from an exported library (the C launchers of `evo export`, by
// address) runs that launcher on torch's current stream; every other call (another shape,
// dtype, layout, device, a view that is not 16-byte aligned, a call that needs gradients) is
// at::matmul / at::linear, i.e. cuBLAS on the GPU. The Meta kernel (torch.compile's fake
// tensors, shape inference) is the same fallback, so the traced result is exactly what
// at::matmul / at::linear would give. C is allocated by torch's caching allocator, as is the
// workspace, so the op is safe inside CUDA graphs.
//
// Built without EVO_WITH_CUDA (a CPU-only torch), the CUDA kernel is absent and every call
// is the fallback; evo_native::has_cuda() says which build this is.
//
// call_counts() -> [evolved, fallback]: CUDA calls that launched an exported kernel and CUDA
// calls that fell back to cuBLAS since reset_counts(). Counted on the host when the call is
// made, so a CUDA graph's capture counts its launches once and its replays not at all: the
// count taken around a capture is how many evolved GEMMs the graph holds.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <unordered_map>
#include <vector>

#ifdef EVO_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace {

// int evo_hgemm_<key>(A, B, C, M, N, K, workspace, stream), as evo export writes it.
using Launcher = int (*)(const void*, const void*, void*, int, int, int, void*, void*);

// int evo_hgemm_<key>_wb(A, B, ldb, C, M, N, K, workspace, stream): B already padded (rows ldb apart).
using PreparedLauncher = int (*)(const void*, const void*, long long, void*, int, int, int, void*, void*);

struct Kernel {
  Launcher fn;
  int64_t workspace;
  PreparedLauncher prepared = nullptr;  // set by register_prepared for a kernel that stages B
};

inline uint64_t key_of(int64_t m, int64_t n, int64_t k, bool tn) {
  // M, N, K below 2^21 each (checked at registration): one 64-bit key.
  return (uint64_t(m) << 43) | (uint64_t(n) << 22) | (uint64_t(k) << 1) | uint64_t(tn);
}

std::mutex table_mutex;
std::unordered_map<uint64_t, Kernel> table;
std::atomic<int64_t> n_evolved{0}, n_fallback{0};

std::vector<int64_t> call_counts() { return {n_evolved.load(), n_fallback.load()}; }

void reset_counts() {
  n_evolved = 0;
  n_fallback = 0;
}

void register_kernel(int64_t m, int64_t n, int64_t k, const std::string& layout, int64_t address,
                     int64_t workspace) {
  TORCH_CHECK(layout == "TN" || layout == "NN", "evo_native: layout must be TN or NN, got ", layout);
  TORCH_CHECK(m > 0 && n > 0 && k > 0 && m < (1 << 21) && n < (1 << 21) && k < (1 << 21),
              "evo_native: shape out of range");
  TORCH_CHECK(address != 0 && workspace >= 0, "evo_native: bad launcher");
  std::lock_guard<std::mutex> g(table_mutex);
  table[key_of(m, n, k, layout == "TN")] = Kernel{reinterpret_cast<Launcher>(address), workspace};
}

void register_prepared(int64_t m, int64_t n, int64_t k, int64_t address) {
  TORCH_CHECK(address != 0, "evo_native: bad launcher");
  std::lock_guard<std::mutex> g(table_mutex);
  auto it = table.find(key_of(m, n, k, true));
  TORCH_CHECK(it != table.end(), "evo_native: register the kernel for ", m, "x", n, "x", k, " TN before its prepared-B launcher");
  it->second.prepared = reinterpret_cast<PreparedLauncher>(address);
}

void clear_kernels() {
  std::lock_guard<std::mutex> g(table_mutex);
  table.clear();
}

int64_t kernel_count() {
  std::lock_guard<std::mutex> g(table_mutex);
  return int64_t(table.size());
}

bool has_cuda() {
#ifdef EVO_WITH_CUDA
  return true;
#else
  return false;
#endif
}

// Row-major contiguity of a (rows x cols) matrix, ignoring the strides of size-1 dimensions.
inline bool row_major(int64_t rows, int64_t cols, int64_t s_row, int64_t s_col) {
  return (cols == 1 || s_col == 1) && (rows == 1 || s_row == cols);
}

at::Tensor mm_fallback(const at::Tensor& a, const at::Tensor& b) { return at::matmul(a, b); }

at::Tensor linear_fallback(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  return at::linear(x, w, bias);
}

at::Tensor linear_prepared_fallback(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wpad,
                                    const c10::optional<at::Tensor>& bias) {
  return at::linear(x, w, bias);
}

#ifdef EVO_WITH_CUDA
// The launcher for C (m x n) = A (m x k) . B where B is w^T (TN) or a (k x n) matrix (NN), or
// nothing when the table has no kernel for it
// (a copy: the table may be refilled by another thread while the kernel runs).
std::optional<Kernel> find(int64_t m, int64_t n, int64_t k, bool tn) {
  std::lock_guard<std::mutex> g(table_mutex);
  auto it = table.find(key_of(m, n, k, tn));
  if (it == table.end()) return std::nullopt;
  return it->second;
}

inline bool half_cuda(const at::Tensor& t, const at::Device& dev) {
  return t.scalar_type() == at::kHalf && t.device() == dev &&
         reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

// Runs the exported kernel into c; false when the launcher answers -1 (the kernel cannot run on
// this device: a grid that must be resident at once does not fit), and the caller falls back.
// With ``ldb`` > 0, ``b`` is the weight padded once and the prepared launcher runs.
bool launch(const Kernel& kn, const at::Tensor& a, const at::Tensor& b, at::Tensor& c, int64_t m, int64_t n,
            int64_t k, int64_t ldb = 0) {
  c10::cuda::CUDAGuard guard(a.device());
  at::Tensor ws;
  if (kn.workspace) ws = at::empty({kn.workspace}, a.options().dtype(at::kByte));
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(a.device().index()).stream();
  void* wsp = kn.workspace ? ws.data_ptr() : nullptr;
  int rc = ldb > 0 ? kn.prepared(a.data_ptr(), b.data_ptr(), (long long)ldb, c.data_ptr(), int(m), int(n), int(k), wsp,
                                 reinterpret_cast<void*>(stream))
                   : kn.fn(a.data_ptr(), b.data_ptr(), c.data_ptr(), int(m), int(n), int(k), wsp,
                           reinterpret_cast<void*>(stream));
  if (rc == -1) return false;
  TORCH_CHECK(rc == 0, "evo_native: the exported kernel for ", m, "x", n, "x", k, " failed with code ", rc);
  n_evolved.fetch_add(1, std::memory_order_relaxed);
  return true;
}

at::Tensor mm_cuda(const at::Tensor& a, const at::Tensor& b) {
  if (a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0) && half_cuda(a, a.device()) &&
      half_cuda(b, a.device()) && row_major(a.size(0), a.size(1), a.stride(0), a.stride(1))) {
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);
    std::optional<Kernel> kn;
    if (row_major(n, k, b.stride(1), b.stride(0))) kn = find(m, n, k, true);  // b = w^T, w (n x k) row-major
    if (!kn && row_major(k, n, b.stride(0), b.stride(1))) kn = find(m, n, k, false);
    if (kn) {
      at::Tensor c = at::empty({m, n}, a.options());
      if (launch(*kn, a, b, c, m, n, k)) return c;
    }
  }
  n_fallback.fetch_add(1, std::memory_order_relaxed);
  return mm_fallback(a, b);
}

// ``wpad``: w padded once (N x ldb, ldb >= K, unit column stride), or undefined: the plain path.
at::Tensor linear_any(const at::Tensor& x, const at::Tensor& w, const at::Tensor* wpad,
                      const c10::optional<at::Tensor>& bias) {
  if (x.dim() >= 1 && w.dim() == 2 && x.size(-1) == w.size(1) && x.numel() > 0 && x.is_contiguous() &&
      half_cuda(x, x.device()) && half_cuda(w, x.device()) && row_major(w.size(0), w.size(1), w.stride(0), w.stride(1))) {
    const int64_t k = w.size(1), n = w.size(0), m = x.numel() / k;
    const bool has_bias = bias.has_value() && bias->defined();
    // a bias of another dtype, device or shape: at::linear's own rules (promotion, broadcast, errors)
    const bool plain_bias = !has_bias || (bias->scalar_type() == at::kHalf && bias->device() == x.device() &&
                                          bias->dim() == 1 && bias->size(0) == n);
    std::optional<Kernel> kn;
    if (plain_bias) kn = find(m, n, k, true);
    // the padded copy only where the kernel has a launcher for it and the copy has the weight's shape
    const bool use_pad = kn && kn->prepared && wpad && wpad->defined() && wpad->dim() == 2 && wpad->size(0) == n &&
                         wpad->size(1) >= k && wpad->stride(1) == 1 && wpad->stride(0) % 8 == 0 &&
                         half_cuda(*wpad, x.device());
    if (kn) {
      std::vector<int64_t> out_shape(x.sizes().begin(), x.sizes().end());
      out_shape.back() = n;
      at::Tensor c = at::empty(out_shape, x.options());
      if (use_pad ? launch(*kn, x, *wpad, c, m, n, k, wpad->stride(0)) : launch(*kn, x, w, c, m, n, k)) {
        if (has_bias) c.add_(*bias);  // bias after the GEMM, as nn.Linear adds it
        return c;
      }
    }
  }
  n_fallback.fetch_add(1, std::memory_order_relaxed);
  return linear_fallback(x, w, bias);
}

at::Tensor linear_cuda(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  return linear_any(x, w, nullptr, bias);
}

at::Tensor linear_prepared_cuda(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wpad,
                                const c10::optional<at::Tensor>& bias) {
  return linear_any(x, w, &wpad, bias);
}
#endif

// Autograd: a call that needs gradients is at::matmul / at::linear (differentiable, cuBLAS);
// otherwise the call goes below autograd to the CPU / CUDA / Meta kernel.
bool wants_grad(std::initializer_list<const at::Tensor*> ts) {
  if (!at::GradMode::is_enabled()) return false;
  for (const at::Tensor* t : ts)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

at::Tensor mm_autograd(const at::Tensor& a, const at::Tensor& b) {
  if (wants_grad({&a, &b})) return at::matmul(a, b);
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("evo_native::mm", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(a, b);
}

at::Tensor linear_autograd(const at::Tensor& x, const at::Tensor& w, const c10::optional<at::Tensor>& bias) {
  at::Tensor none;
  if (wants_grad({&x, &w, bias.has_value() ? &*bias : &none})) return at::linear(x, w, bias);
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("evo_native::linear", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(x, w, bias);
}

at::Tensor linear_prepared_autograd(const at::Tensor& x, const at::Tensor& w, const at::Tensor& wpad,
                                    const c10::optional<at::Tensor>& bias) {
  at::Tensor none;
  if (wants_grad({&x, &w, bias.has_value() ? &*bias : &none})) return at::linear(x, w, bias);
  static auto op = c10::Dispatcher::singleton().findSchemaOrThrow("evo_native::linear_prepared", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                         const c10::optional<at::Tensor>&)>();
  at::AutoDispatchBelowADInplaceOrView below;
  return op.call(x, w, wpad, bias);
}

}  // namespace

TORCH_LIBRARY(evo_native, m) {
  m.def("mm(Tensor a, Tensor b) -> Tensor");
  m.def("linear(Tensor x, Tensor w, Tensor? bias=None) -> Tensor");
  m.def("linear_prepared(Tensor x, Tensor w, Tensor wpad, Tensor? bias=None) -> Tensor");
  m.def("register_kernel(int m, int n, int k, str layout, int address, int workspace) -> ()", &register_kernel);
  m.def("register_prepared(int m, int n, int k, int address) -> ()", &register_prepared);
  m.def("clear_kernels() -> ()", &clear_kernels);
  m.def("kernel_count() -> int", &kernel_count);
  m.def("has_cuda() -> bool", &has_cuda);
  m.def("call_counts() -> int[]", &call_counts);
  m.def("reset_counts() -> ()", &reset_counts);
}

TORCH_LIBRARY_IMPL(evo_native, CPU, m) {
  m.impl("mm", &mm_fallback);
  m.impl("linear", &linear_fallback);
  m.impl("linear_prepared", &linear_prepared_fallback);
}

TORCH_LIBRARY_IMPL(evo_native, Meta, m) {
  m.impl("mm", &mm_fallback);
  m.impl("linear", &linear_fallback);
  m.impl("linear_prepared", &linear_prepared_fallback);
}

#ifdef EVO_WITH_CUDA
TORCH_LIBRARY_IMPL(evo_native, CUDA, m) {
  m.impl("mm", &mm_cuda);
  m.impl("linear", &linear_cuda);
  m.impl("linear_prepared", &linear_prepared_cuda);
}
#endif

TORCH_LIBRARY_IMPL(evo_native, Autograd, m) {
  m.impl("mm", &mm_autograd);
  m.impl("linear", &linear_autograd);
  m.impl("linear_prepared", &linear_prepared_autograd);
}
