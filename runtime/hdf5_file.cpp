#include "runtime/hdf5_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>

#include "runtime/atomic_file.h"

namespace hydra {
namespace {

void silence_hdf5() {
  static const bool done = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)done;
}

// Closes an hid_t of any kind on scope exit.
class Handle {
 public:
  explicit Handle(hid_t id, herr_t (*closer)(hid_t)) : id_(id), closer_(closer) {}
  ~Handle() {
    if (id_ >= 0) closer_(id_);
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  hid_t get() const { return id_; }
  bool ok() const { return id_ >= 0; }

 private:
  hid_t id_;
  herr_t (*closer_)(hid_t);
};

std::string stored_dtype_attribute(hid_t dataset) {
  if (H5Aexists(dataset, "dtype") <= 0) return "";
  Handle attr(H5Aopen(dataset, "dtype", H5P_DEFAULT), H5Aclose);
  if (!attr.ok()) return "";
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  const size_t n = H5Tget_size(type.get());
  std::string value(n, '\0');
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), n);
  if (H5Aread(attr.get(), mem.get(), value.data()) < 0) return "";
  value.resize(strnlen(value.c_str(), n));
  return value;
}

DType classify(hid_t dataset, const std::string& file, const std::string& name) {
  Handle type(H5Dget_type(dataset), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  const size_t size = H5Tget_size(type.get());
  if (cls == H5T_FLOAT && size == 4) return DType::f32;
  if (cls == H5T_FLOAT && size == 8) return DType::f64;
  if (cls == H5T_INTEGER && size == 2 && stored_dtype_attribute(dataset) == "bfloat16") return DType::bf16;
  if (cls == H5T_INTEGER && size == 4) return DType::i32;
  if (cls == H5T_INTEGER && size == 8) return DType::i64;
  HYDRA_USER_FAIL("{}: dataset '{}' has an unsupported element type (class {}, {} bytes); expected "
                  "float32, float64, bfloat16 (uint16 + dtype attribute), int32 or int64",
                  file, name, static_cast<int>(cls), size);
}

hid_t memory_type(DType t) {
  switch (t) {
    case DType::f32: return H5T_NATIVE_FLOAT;
    case DType::bf16: return H5T_NATIVE_UINT16;
    case DType::i32: return H5T_NATIVE_INT32;
    case DType::i64: return H5T_NATIVE_INT64;
    case DType::f64: return H5T_NATIVE_DOUBLE;
  }
  return H5T_NATIVE_FLOAT;
}

}  // namespace

H5File H5File::open_read(const std::string& path) {
  silence_hdf5();
  require_readable_file(path, "HDF5");
  const htri_t is_h5 = H5Fis_hdf5(path.c_str());
  HYDRA_USER_CHECK(is_h5 > 0, "{}: not an HDF5 file", path);
  const hid_t id = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  HYDRA_USER_CHECK(id >= 0, "{}: cannot open as HDF5 (damaged or truncated file?)", path);
  return H5File(id, path);
}

H5File H5File::create(const std::string& path) {
  silence_hdf5();
  const hid_t id = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  HYDRA_USER_CHECK(id >= 0, "{}: cannot create HDF5 file", path);
  return H5File(id, path);
}

H5File::H5File(H5File&& other) noexcept : id_(other.id_), path_(std::move(other.path_)) { other.id_ = -1; }

H5File& H5File::operator=(H5File&& other) noexcept {
  if (this != &other) {
    if (id_ >= 0) H5Fclose(id_);
    id_ = other.id_;
    path_ = std::move(other.path_);
    other.id_ = -1;
  }
  return *this;
}

H5File::~H5File() {
  if (id_ >= 0) H5Fclose(id_);
}

void H5File::close() {
  if (id_ < 0) return;
  const hid_t id = id_;
  id_ = -1;
  HYDRA_USER_CHECK(H5Fflush(id, H5F_SCOPE_LOCAL) >= 0 && H5Fclose(id) >= 0,
                   "{}: writing the HDF5 file failed (disk full?)", path_);
}

bool H5File::has_dataset(const std::string& name) const {
  if (H5Lexists(id_, name.c_str(), H5P_DEFAULT) <= 0) return false;
  H5O_info_t info;
  if (H5Oget_info_by_name(id_, name.c_str(), &info, H5P_DEFAULT) < 0) return false;
  return info.type == H5O_TYPE_DATASET;
}

std::vector<std::string> H5File::dataset_names() const {
  std::vector<std::string> names;
  auto visit = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    H5O_info_t info;
    if (H5Oget_info_by_name(group, name, &info, H5P_DEFAULT) >= 0 && info.type == H5O_TYPE_DATASET) {
      static_cast<std::vector<std::string>*>(data)->emplace_back(name);
    }
    return 0;
  };
  hsize_t index = 0;
  HYDRA_USER_CHECK(H5Literate(id_, H5_INDEX_NAME, H5_ITER_INC, &index, visit, &names) >= 0,
                   "{}: cannot list datasets", path_);
  std::sort(names.begin(), names.end());
  return names;
}

DatasetInfo H5File::dataset_info(const std::string& name) const {
  HYDRA_USER_CHECK(has_dataset(name), "{}: dataset '{}' is missing", path_, name);
  Handle dataset(H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  HYDRA_USER_CHECK(rank >= 0 && rank <= kMaxRank, "{}: dataset '{}' has rank {} (at most {} supported)",
                   path_, name, rank, kMaxRank);
  hsize_t dims[kMaxRank] = {};
  H5Sget_simple_extent_dims(space.get(), dims, nullptr);
  DatasetInfo info;
  for (int d = 0; d < rank; ++d) info.shape.push_back(static_cast<int64_t>(dims[d]));
  info.dtype = classify(dataset.get(), path_, name);
  return info;
}

Tensor H5File::read(const std::string& name) const {
  const DatasetInfo info = dataset_info(name);
  Tensor t = Tensor::empty(info.shape, info.dtype, Device::host);
  read_into(name, t);
  return t;
}

void H5File::read_into(const std::string& name, const TensorView& out) const {
  const DatasetInfo info = dataset_info(name);
  HYDRA_ASSERT(out.on_host() && out.is_contiguous(), "read_into needs a contiguous host view");
  HYDRA_USER_CHECK(std::equal(info.shape.begin(), info.shape.end(), out.shape().begin(), out.shape().end()),
                   "{}: dataset '{}' has shape {}, expected {}", path_, name,
                   TensorView(nullptr, info.dtype, Device::host, info.shape).shape_string(),
                   out.shape_string());
  Handle dataset(H5Dopen2(id_, name.c_str(), H5P_DEFAULT), H5Dclose);
  if (info.dtype == out.dtype()) {
    HYDRA_USER_CHECK(H5Dread(dataset.get(), memory_type(out.dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                             out.data()) >= 0,
                     "{}: reading dataset '{}' failed (truncated file?)", path_, name);
    return;
  }
  const bool float_pair = (info.dtype == DType::f32 || info.dtype == DType::bf16) &&
                          (out.dtype() == DType::f32 || out.dtype() == DType::bf16);
  const bool int_pair = (info.dtype == DType::i32 || info.dtype == DType::i64) &&
                        (out.dtype() == DType::i32 || out.dtype() == DType::i64);
  HYDRA_USER_CHECK(float_pair || int_pair, "{}: dataset '{}' is {}, expected {}", path_, name,
                   dtype_name(info.dtype), dtype_name(out.dtype()));
  Tensor staged = Tensor::empty(info.shape, info.dtype, Device::host);
  read_into(name, staged);
  copy_into(out, staged);
}

void H5File::write(const std::string& name, const TensorView& tensor) {
  HYDRA_ASSERT(tensor.on_host(), "write of a device tensor '{}'", name);
  Tensor contiguous;
  const TensorView* src = &tensor;
  if (!tensor.is_contiguous()) {
    contiguous = clone(tensor);
    src = &contiguous.view();
  }
  hsize_t dims[kMaxRank] = {};
  for (int d = 0; d < src->rank(); ++d) dims[d] = static_cast<hsize_t>(src->size(d));
  Handle space(H5Screate_simple(src->rank(), dims, nullptr), H5Sclose);
  const hid_t file_type = src->dtype() == DType::f32    ? H5T_IEEE_F32LE
                          : src->dtype() == DType::bf16 ? H5T_STD_U16LE
                          : src->dtype() == DType::i32  ? H5T_STD_I32LE
                                                        : H5T_STD_I64LE;
  Handle dataset(H5Dcreate2(id_, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot create dataset '{}'", path_, name);
  HYDRA_USER_CHECK(H5Dwrite(dataset.get(), memory_type(src->dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                            src->data()) >= 0,
                   "{}: writing dataset '{}' failed (disk full?)", path_, name);
  if (src->dtype() == DType::bf16) {
    Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), 8);
    Handle attr(H5Acreate2(dataset.get(), "dtype", type.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    HYDRA_USER_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), "bfloat16") >= 0,
                     "{}: cannot tag dataset '{}' as bfloat16", path_, name);
  }
}

bool H5File::has_attribute(const std::string& name) const { return H5Aexists(id_, name.c_str()) > 0; }

void H5File::set_attribute(const std::string& name, const std::string& value) {
  Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(type.get(), std::max<size_t>(1, value.size()));
  H5Tset_strpad(type.get(), H5T_STR_NULLPAD);
  if (has_attribute(name)) H5Adelete(id_, name.c_str());
  Handle attr(H5Acreate2(id_, name.c_str(), type.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  HYDRA_USER_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), value.empty() ? "" : value.data()) >= 0,
                   "{}: cannot write attribute '{}'", path_, name);
}

void H5File::set_attribute(const std::string& name, int64_t value) {
  Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  if (has_attribute(name)) H5Adelete(id_, name.c_str());
  Handle attr(H5Acreate2(id_, name.c_str(), H5T_STD_I64LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  HYDRA_USER_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_INT64, &value) >= 0,
                   "{}: cannot write attribute '{}'", path_, name);
}

void H5File::set_attribute(const std::string& name, double value) {
  Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
  if (has_attribute(name)) H5Adelete(id_, name.c_str());
  Handle attr(H5Acreate2(id_, name.c_str(), H5T_IEEE_F64LE, scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
  HYDRA_USER_CHECK(attr.ok() && H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0,
                   "{}: cannot write attribute '{}'", path_, name);
}

std::string H5File::string_attribute(const std::string& name) const {
  HYDRA_USER_CHECK(has_attribute(name), "{}: attribute '{}' is missing", path_, name);
  Handle attr(H5Aopen(id_, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  HYDRA_USER_CHECK(H5Tget_class(type.get()) == H5T_STRING, "{}: attribute '{}' is not a string", path_, name);
  // The memory type takes the stored character set: HDF5 does not convert ASCII <-> UTF-8, and
  // h5py writes str attributes as variable-length UTF-8.
  const H5T_cset_t cset = H5Tget_cset(type.get());
  if (H5Tis_variable_str(type.get()) > 0) {
    Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(mem.get(), H5T_VARIABLE);
    H5Tset_cset(mem.get(), cset);
    char* text = nullptr;
    HYDRA_USER_CHECK(H5Aread(attr.get(), mem.get(), &text) >= 0, "{}: cannot read attribute '{}'", path_, name);
    std::string value = text ? text : "";
    H5free_memory(text);
    return value;
  }
  const size_t n = H5Tget_size(type.get());
  std::string value(n, '\0');
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_size(mem.get(), n);
  H5Tset_strpad(mem.get(), H5T_STR_NULLPAD);
  H5Tset_cset(mem.get(), cset);
  HYDRA_USER_CHECK(H5Aread(attr.get(), mem.get(), value.data()) >= 0, "{}: cannot read attribute '{}'", path_, name);
  value.resize(strnlen(value.c_str(), n));
  return value;
}

int64_t H5File::int_attribute(const std::string& name) const {
  HYDRA_USER_CHECK(has_attribute(name), "{}: attribute '{}' is missing", path_, name);
  Handle attr(H5Aopen(id_, name.c_str(), H5P_DEFAULT), H5Aclose);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  HYDRA_USER_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, "{}: attribute '{}' is not an integer", path_, name);
  int64_t value = 0;
  HYDRA_USER_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value) >= 0, "{}: cannot read attribute '{}'", path_, name);
  return value;
}

double H5File::double_attribute(const std::string& name) const {
  HYDRA_USER_CHECK(has_attribute(name), "{}: attribute '{}' is missing", path_, name);
  Handle attr(H5Aopen(id_, name.c_str(), H5P_DEFAULT), H5Aclose);
  double value = 0;
  HYDRA_USER_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0, "{}: cannot read attribute '{}'", path_, name);
  return value;
}

}  // namespace hydra
