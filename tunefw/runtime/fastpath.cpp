// tunefw's compiled call path (built by tunefw/runtime/fastpath.py when a table is first set).
//
// In a host-bound eager model every Python operation of a GEMM call costs: the H200's host spent
// 28 us in a tuned call's Plan.__call__ (15 of them in cuda-bindings' launch) and 20 more in
// tunefw.Linear's checks, against 27 us for nn.Linear's whole call (hf_eager_split_h200.json).
// Here one C++ call does what those do once a layer has met a shape: the checks, the output
// allocation, the argument buffer lookup and the launch (cuLaunchKernel through a function
// pointer the Python side hands over), or F.linear's own at::linear for a cuBLAS route.
#include <ATen/ATen.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <c10/util/SmallVector.h>
#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/python.h>

#include <array>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

namespace py = pybind11;

namespace {

// CUresult cuLaunchKernel(CUfunction, gx, gy, gz, bx, by, bz, smem, CUstream, void**, void**)
using LaunchFn = int (*)(void*, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                         unsigned, void*, void**, void**);
// CUresult cuLaunchKernelEx(const CUlaunchConfig*, CUfunction, void** params, void** extra), for
// kernels launched in clusters. The structs as cuda.h lays them out (CUDA 12 and 13).
struct LaunchAttribute {
  int id;  // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4
  char pad[4];
  union {
    char raw[64];
    struct {
      unsigned x, y, z;
    } cluster;
  } value;
};
struct LaunchConfig {
  unsigned grid[3], block[3], smem;
  void* stream;
  LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchAttribute) == 72 && sizeof(LaunchConfig) == 56, "cuda.h's layout");
constexpr int kClusterDimension = 4;
using LaunchExFn = int (*)(const LaunchConfig*, void*, void**, void**);
LaunchFn g_launch = nullptr;
LaunchExFn g_launch_ex = nullptr;
// The table (dispatcher) serving now, by serial: a layer's routes are kept per table, so that
// switching tables (and back) never serves one table's route for another's.
uint64_t g_table = 0;
constexpr size_t kTablesKept = 4;  // route maps a layer keeps (the oldest goes)
constexpr int64_t kAlign = 16;
constexpr size_t kArgSetsKept = 4096;

struct Triple {
  uintptr_t a, b, c;
  bool operator==(const Triple& o) const { return a == o.a && b == o.b && c == o.c; }
};
struct TripleHash {
  size_t operator()(const Triple& t) const {
    return std::hash<uintptr_t>()(t.a) ^ (std::hash<uintptr_t>()(t.b) * 31) ^
           (std::hash<uintptr_t>()(t.c) * 1000003);
  }
};

bool servable(const at::Tensor& t) {
  return t.is_contiguous() && reinterpret_cast<uintptr_t>(t.data_ptr()) % kAlign == 0;
}

// One plan's kernel: its function, geometry, problem and argument buffers by address.
class Kernel {
 public:
  Kernel(uintptr_t function, std::array<unsigned, 3> grid, std::array<unsigned, 3> block,
         std::array<unsigned, 3> cluster, unsigned smem, std::array<int64_t, 4> shape, int device,
         at::ScalarType dtype, py::object build_args)
      : function_(reinterpret_cast<void*>(function)), grid_(grid), block_(block),
        cluster_(cluster), smem_(smem), m_(shape[0]), n_(shape[1]), k_(shape[2]),
        b_rows_(shape[3]), device_(device),
        dtype_(dtype), build_args_(std::move(build_args)) {
    clustered_ = cluster[0] * cluster[1] * cluster[2] != 1;
  }

  // C = a @ b.T in a's leading shape (a's rows M x K, b N x K; a gated kernel's b is [Bg; Bu] of
  // 2N rows and C = silu(a Bg^T) * (a Bu^T)), or an undefined tensor when the kernel cannot read
  // them or the driver refuses the launch (the Python path then decides).
  at::Tensor run(const at::Tensor& a, const at::Tensor& b) {
    if ((clustered_ ? g_launch_ex == nullptr : g_launch == nullptr) ||
        a.scalar_type() != dtype_ || b.scalar_type() != dtype_ || !servable(a) || !servable(b) ||
        a.get_device() != device_ || b.get_device() != device_ || a.dim() < 1 || b.dim() != 2 ||
        a.size(-1) != k_ || b.size(0) != b_rows_ || b.size(1) != k_ || a.numel() != m_ * k_) {
      return at::Tensor();
    }
    c10::SmallVector<int64_t, 4> sizes(a.sizes().begin(), a.sizes().end());
    sizes.back() = n_;
    at::Tensor c = at::empty(sizes, a.options());
    void** params = args(a, b, c);
    void* stream = nullptr;
    if (a.is_cuda()) {
      c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
      stream = impl.getStream(c10::Device(c10::DeviceType::CUDA, device_)).native_handle();
    }
    int err;
    if (clustered_) {
      LaunchAttribute attr{};
      attr.id = kClusterDimension;
      attr.value.cluster = {cluster_[0], cluster_[1], cluster_[2]};
      LaunchConfig config{{grid_[0], grid_[1], grid_[2]}, {block_[0], block_[1], block_[2]}, smem_,
                          stream, &attr, 1};
      err = g_launch_ex(&config, function_, params, nullptr);
    } else {
      err = g_launch(function_, grid_[0], grid_[1], grid_[2], block_[0], block_[1], block_[2],
                     smem_, stream, params, nullptr);
    }
    return err == 0 ? c : at::Tensor();  // e.g. no context current on this thread
  }

  size_t arg_sets() const { return args_.size(); }

 private:
  void** args(const at::Tensor& a, const at::Tensor& b, const at::Tensor& c) {
    Triple key{reinterpret_cast<uintptr_t>(a.data_ptr()), reinterpret_cast<uintptr_t>(b.data_ptr()),
               reinterpret_cast<uintptr_t>(c.data_ptr())};
    auto it = args_.find(key);
    if (it != args_.end()) return it->second.first;
    // (address of the void** buffer, what keeps it alive), built by the Python plan
    py::tuple built = build_args_(key.a, key.b, key.c);
    if (args_.size() >= kArgSetsKept) args_.clear();
    void** params = reinterpret_cast<void**>(built[0].cast<uintptr_t>());
    args_.emplace(key, std::make_pair(params, py::object(built[1])));
    return params;
  }

  void* function_;
  std::array<unsigned, 3> grid_, block_, cluster_;
  bool clustered_;
  unsigned smem_;
  int64_t m_, n_, k_, b_rows_;  // b_rows_: the weight's rows (N, or 2N gated)
  int device_;
  at::ScalarType dtype_;
  py::object build_args_;
  std::unordered_map<Triple, std::pair<void**, py::object>, TripleHash> args_;
};

// A layer's routes by input shape: cuBLAS (at::linear) or a Kernel; misses go back to Python.
struct Key {
  c10::SmallVector<int64_t, 4> sizes;  // no allocation per call for up to 4 dimensions
  int8_t dtype;
  int8_t device;
  bool operator==(const Key& o) const {
    return dtype == o.dtype && device == o.device && sizes == o.sizes;
  }
};
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int>()(k.dtype * 131 + k.device);
    for (auto s : k.sizes) h = h * 1000003 ^ std::hash<int64_t>()(s);
    return h;
  }
};

Key key_of(const at::Tensor& x) {
  return Key{c10::SmallVector<int64_t, 4>(x.sizes().begin(), x.sizes().end()),
             static_cast<int8_t>(x.scalar_type()), static_cast<int8_t>(x.get_device())};
}

using RouteMap = std::unordered_map<Key, std::shared_ptr<Kernel>, KeyHash>;

class Routes {
 public:
  // The layer's output, or None where Python must decide: a shape without a route under the
  // table serving now, grad to record, a tensor subclass (THPVariable_CheckExact: a Tensor or a
  // Parameter), a dispatch or torch function mode.
  py::object forward(py::handle x_obj, py::handle w_obj, py::handle bias_obj) {
    if (!THPVariable_CheckExact(x_obj.ptr()) || !THPVariable_CheckExact(w_obj.ptr()) ||
        c10::impl::TorchDispatchModeTLS::stack_len() > 0 ||
        at::impl::PythonTorchFunctionTLS::stack_len() > 0) {
      return py::none();
    }
    const RouteMap* routes = current();
    if (routes == nullptr) return py::none();
    const at::Tensor& x = THPVariable_Unpack(x_obj.ptr());
    const at::Tensor& w = THPVariable_Unpack(w_obj.ptr());
    if (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())) return py::none();
    auto it = routes->find(key_of(x));
    if (it == routes->end()) return py::none();
    c10::optional<at::Tensor> bias;
    if (!bias_obj.is_none()) {
      if (!THPVariable_CheckExact(bias_obj.ptr())) return py::none();
      bias = THPVariable_Unpack(bias_obj.ptr());
    }
    at::Tensor y;
    if (!it->second) {
      y = at::linear(x, w, bias);
    } else {
      y = it->second->run(x, w);
      if (y.defined() && bias) y.add_(*bias);
    }
    if (!y.defined()) return py::none();
    return py::reinterpret_steal<py::object>(THPVariable_Wrap(std::move(y)));
  }

  void set_cublas(const at::Tensor& x) { store(x, nullptr); }
  void set_kernel(const at::Tensor& x, std::shared_ptr<Kernel> kernel) { store(x, std::move(kernel)); }
  // Routes under the table serving now.
  size_t size() const {
    const RouteMap* routes = current();
    return routes == nullptr ? 0 : routes->size();
  }

 private:
  const RouteMap* current() const {
    for (const auto& t : tables_) {
      if (t.first == g_table) return &t.second;
    }
    return nullptr;
  }
  void store(const at::Tensor& x, std::shared_ptr<Kernel> kernel) {
    auto* routes = const_cast<RouteMap*>(current());
    if (routes == nullptr) {
      if (tables_.size() >= kTablesKept) tables_.erase(tables_.begin());
      tables_.emplace_back(g_table, RouteMap());
      routes = &tables_.back().second;
    }
    (*routes)[key_of(x)] = std::move(kernel);
  }

  std::vector<std::pair<uint64_t, RouteMap>> tables_;  // (table serial, its routes), oldest first
};

// route(routes, x, weight, bias): a layer's output by its routes, or None (Routes::forward). A
// METH_FASTCALL builtin rather than a pybind11 method: no argument tuple, no overload dispatch,
// about 0.2 us less a call on a 2-core CPU (as cheap as F.linear's own binding there).
PyObject* route(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "route(routes, x, weight, bias): 4 arguments");
    return nullptr;
  }
  auto* routes = py::cast<Routes*>(py::handle(args[0]));
  return routes->forward(args[1], args[2], args[3]).release().ptr();
  END_HANDLE_TH_ERRORS
}

// launch(kernel, a, b): C from the plan's kernel, or None (Kernel::run), for Plan.__call__.
PyObject* launch(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 3 || !THPVariable_Check(args[1]) || !THPVariable_Check(args[2])) {
    PyErr_SetString(PyExc_TypeError, "launch(kernel, a, b): a kernel and two tensors");
    return nullptr;
  }
  auto* kernel = py::cast<Kernel*>(py::handle(args[0]));
  at::Tensor c = kernel->run(THPVariable_Unpack(args[1]), THPVariable_Unpack(args[2]));
  if (!c.defined()) Py_RETURN_NONE;
  return THPVariable_Wrap(std::move(c));
  END_HANDLE_TH_ERRORS
}

PyMethodDef kRouteDef = {"route", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(route)),
                         METH_FASTCALL, "route(routes, x, weight, bias): a layer's output or None"};
PyMethodDef kLaunchDef = {"launch",
                          reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(launch)),
                          METH_FASTCALL, "launch(kernel, a, b): C = a @ b.T or None"};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tunefw's compiled call path (tunefw/runtime/fastpath.py)";
  m.add_object("route", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kRouteDef, nullptr, m.ptr())));
  m.add_object("launch", py::reinterpret_steal<py::object>(PyCFunction_NewEx(&kLaunchDef, nullptr, m.ptr())));
  m.def("set_launchers", [](uintptr_t fn, uintptr_t fn_ex) {
        g_launch = reinterpret_cast<LaunchFn>(fn);
        g_launch_ex = reinterpret_cast<LaunchExFn>(fn_ex);
      }, "The addresses of cuLaunchKernel and cuLaunchKernelEx (or stand-ins with their signatures).");
  m.def("has_launchers", []() { return g_launch != nullptr && g_launch_ex != nullptr; });
  m.def("set_table", [](uint64_t serial) { g_table = serial; },
        "The serial of the table serving now: layers serve the routes they settled under it.");
  py::class_<Kernel, std::shared_ptr<Kernel>>(m, "Kernel")
      .def(py::init<uintptr_t, std::array<unsigned, 3>, std::array<unsigned, 3>,
                    std::array<unsigned, 3>, unsigned, std::array<int64_t, 4>, int, at::ScalarType,
                    py::object>())
      .def_property_readonly("arg_sets", &Kernel::arg_sets);
  py::class_<Routes>(m, "Routes")
      .def(py::init<>())
      .def("set_cublas", &Routes::set_cublas)
      .def("set_kernel", &Routes::set_kernel)
      .def("__len__", &Routes::size);
}
