#include "runtime/hdf5_file.h"

#include <hdf5.h>

#include <algorithm>
#include <cstring>

#include "runtime/atomic_file.h"
#include "runtime/host_memory.h"

namespace hydra {
namespace {

void silence_hdf5() {
  static const bool done = [] {
    // Before any other HDF5 call: no library shutdown at exit. HDF5 1.10 keeps a file whose close
    // failed (a full disk) in its tables and crashes closing it again at exit, after hydra has
    // printed its error; every file hydra writes is closed explicitly (close(), or the destructor),
    // so there is nothing left for the shutdown to do.
    H5dont_atexit();
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

// The link access of every open: external links (a name in this file standing for an object of
// another file) are never followed — a file never makes hydra read another (has_dataset names such
// a link). A dataset access list, which is also a link access list (H5Dopen2 takes it).
herr_t refuse_external_link(const char*, const char*, const char*, const char*, unsigned*, hid_t, void*) { return -1; }
hid_t local_links() {
  static const hid_t plist = [] {
    const hid_t p = H5Pcreate(H5P_DATASET_ACCESS);
    HYDRA_ASSERT(p >= 0 && H5Pset_elink_cb(p, refuse_external_link, nullptr) >= 0, "HDF5 link access list");
    return p;
  }();
  return plist;
}

// Whether `name` under `loc` is a dataset. H5Oopen + H5Iget_type rather than H5Oget_info_by_name:
// the latter's signature and info struct differ between HDF5 1.10 and 1.12+ (the sanitizer build
// links a newer HDF5 than Debian 12's 1.10; cluster/sanitize.sh says why).
bool is_dataset(hid_t loc, const char* name) {
  const Handle object(H5Oopen(loc, name, local_links()), H5Oclose);
  return object.ok() && H5Iget_type(object.get()) == H5I_DATASET;
}

// Attributes are read into buffers sized for one element: an attribute stored as an array (or a
// string declared larger than any config) would be written past the buffer's end.
constexpr size_t kMaxAttributeBytes = size_t{64} << 20;

bool holds_one_element(hid_t attr) {
  Handle space(H5Aget_space(attr), H5Sclose);
  return space.ok() && H5Sget_simple_extent_npoints(space.get()) == 1;
}

// The one reader of string attributes (a file's root attributes and a dataset's `dtype`): one value,
// fixed-length (hydra's writer, NULLPAD) or variable-length (h5py writes a Python str so), in the
// stored character set — HDF5 does not convert ASCII <-> UTF-8, and h5py writes UTF-8. Returns false
// with `problem` saying why when `object` has no such attribute or it is not one string.
bool read_string_attribute(hid_t object, const char* name, std::string& value, std::string& problem) {
  if (H5Aexists(object, name) <= 0) {
    problem = "is missing";
    return false;
  }
  Handle attr(H5Aopen(object, name, H5P_DEFAULT), H5Aclose);
  if (!attr.ok() || !holds_one_element(attr.get())) {
    problem = "is not a single value";
    return false;
  }
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  if (!type.ok() || H5Tget_class(type.get()) != H5T_STRING) {
    problem = "is not a string";
    return false;
  }
  const H5T_cset_t cset = H5Tget_cset(type.get());
  Handle mem(H5Tcopy(H5T_C_S1), H5Tclose);
  H5Tset_cset(mem.get(), cset);
  if (H5Tis_variable_str(type.get()) > 0) {
    H5Tset_size(mem.get(), H5T_VARIABLE);
    char* text = nullptr;
    if (H5Aread(attr.get(), mem.get(), &text) < 0) {
      problem = "cannot be read";
      return false;
    }
    value = text ? text : "";
    H5free_memory(text);
    return true;
  }
  const size_t n = H5Tget_size(type.get());
  if (n == 0 || n > kMaxAttributeBytes) {
    problem = fmt::format("declares a string of {} bytes (damaged file?)", n);
    return false;
  }
  value.assign(n, '\0');
  H5Tset_size(mem.get(), n);
  H5Tset_strpad(mem.get(), H5T_STR_NULLPAD);
  if (H5Aread(attr.get(), mem.get(), value.data()) < 0) {
    problem = "cannot be read";
    return false;
  }
  value.resize(strnlen(value.c_str(), n));
  return true;
}

// A dataset's `dtype` attribute ("bfloat16" marks uint16 storage as bf16), or "" if it has none.
std::string stored_dtype_attribute(hid_t dataset) {
  std::string value, problem;
  return read_string_attribute(dataset, "dtype", value, problem) ? value : "";
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
  // H5Fclose runs whatever the flush returned: a file left open after a failed flush makes the HDF5
  // library flush it again (and crash) when it shuts down at exit.
  const herr_t flushed = H5Fflush(id, H5F_SCOPE_LOCAL);
  const herr_t closed = H5Fclose(id);
  HYDRA_USER_CHECK(flushed >= 0 && closed >= 0, "{}: writing the HDF5 file failed (disk full or over a file size "
                   "limit?)", destination_of(path_));
}

bool H5File::has_dataset(const std::string& name) const {
  if (H5Lexists(id_, name.c_str(), local_links()) <= 0) return false;
  if (is_dataset(id_, name.c_str())) return true;
  H5L_info_t link{};
  HYDRA_USER_CHECK(H5Lget_info(id_, name.c_str(), &link, H5P_DEFAULT) < 0 || link.type != H5L_TYPE_EXTERNAL,
                   "{}: '{}' is a link to another file, which hydra does not follow", path_, name);
  return false;
}

std::vector<std::string> H5File::dataset_names() const {
  std::vector<std::string> names;
  auto visit = [](hid_t group, const char* name, const H5L_info_t*, void* data) -> herr_t {
    if (is_dataset(group, name)) static_cast<std::vector<std::string>*>(data)->emplace_back(name);
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
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  HYDRA_USER_CHECK(rank >= 0 && rank <= kMaxRank, "{}: dataset '{}' has rank {} (at most {} supported)",
                   path_, name, rank, kMaxRank);
  hsize_t dims[kMaxRank] = {};
  HYDRA_USER_CHECK(H5Sget_simple_extent_dims(space.get(), dims, nullptr) >= 0, "{}: cannot read the shape of dataset "
                   "'{}' (damaged file?)", path_, name);
  DatasetInfo info;
  std::string dims_text;
  for (int d = 0; d < rank; ++d) {
    dims_text += fmt::format("{}{}", d ? ", " : "", dims[d]);
    HYDRA_USER_CHECK(dims[d] <= static_cast<hsize_t>(kMaxElements), "{}: dataset '{}' declares shape [{}], more than "
                     "2^50 elements in one dimension (damaged file?)", path_, name, dims_text);
    info.shape.push_back(static_cast<int64_t>(dims[d]));
  }
  HYDRA_USER_CHECK(checked_numel(info.shape) >= 0, "{}: dataset '{}' declares shape {}, more than 2^50 elements "
                   "(damaged file?)", path_, name, format_shape(info.shape));
  info.dtype = classify(dataset.get(), path_, name);
  return info;
}

namespace {
// A dataset's declared size is read from the file: refuse one that cannot fit before allocating it
// (a damaged header can declare petabytes; HDF5 fills unwritten chunks with zeros, so a small file
// can declare a huge dataset).
void check_fits_in_memory(const std::string& file, const std::string& name, const DatasetInfo& info) {
  const double bytes = static_cast<double>(checked_numel(info.shape)) * static_cast<double>(dtype_size(info.dtype));
  if (bytes < 1073741824.0) return;  // below 1 GiB: no need to ask
  const double available = host_available_bytes();
  HYDRA_USER_CHECK(bytes <= available,
                   "{}: dataset '{}' of shape {} needs {:.1f} GiB, more than the {:.1f} GiB of host memory available",
                   file, name, format_shape(info.shape), bytes / 1073741824.0, available / 1073741824.0);
}
}  // namespace

Tensor H5File::read(const std::string& name) const {
  const DatasetInfo info = dataset_info(name);
  {
    // What the file holds first (a header declaring a huge dataset is a damaged file before it is
    // a question of memory), then whether it fits.
    Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
    HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
    check_storage(dataset.get(), info, name);
  }
  check_fits_in_memory(path_, name, info);
  Tensor t = Tensor::empty(info.shape, info.dtype, Device::host);
  read_into(name, t);
  return t;
}

// What a dataset's header says is checked against what the file holds before HDF5 reads it
// (DESIGN.md §4 "Hostile and damaged files"):
// - compact and contiguous storage holds exactly the bytes the shape and element type need (HDF5
//   1.10 trusts the layout message and copies past the end of its buffer otherwise), and a
//   contiguous block lies inside the file;
// - chunked storage has every chunk the shape covers: HDF5 reads an unwritten chunk as its fill
//   value (zeros), so a 1.4 KB file could declare 2^40 token ids or a weight with no data;
// - its filters (compression) are ones this HDF5 library decodes (h5py's lzf is a plugin);
// - its values live in this file: external raw-data files and virtual datasets (which map other
//   files) are refused, as links to other files are (has_dataset).
void H5File::check_storage(int64_t dataset, const DatasetInfo& info, const std::string& name) const {
  Handle dcpl(H5Dget_create_plist(dataset), H5Pclose);
  HYDRA_USER_CHECK(dcpl.ok(), "{}: cannot read the layout of dataset '{}' (damaged file?)", path_, name);
  const H5D_layout_t layout = H5Pget_layout(dcpl.get());
  HYDRA_USER_CHECK(layout == H5D_COMPACT || layout == H5D_CONTIGUOUS || layout == H5D_CHUNKED,
                   "{}: dataset '{}' is {}, which hydra does not read (its values would come from other files)", path_,
                   name, layout == H5D_VIRTUAL ? "a virtual dataset" : "stored in an unknown layout");
  HYDRA_USER_CHECK(H5Pget_external_count(dcpl.get()) == 0, "{}: dataset '{}' keeps its values in other files (HDF5 "
                   "external storage), which hydra does not read", path_, name);
  const int filters = H5Pget_nfilters(dcpl.get());
  HYDRA_USER_CHECK(filters >= 0, "{}: cannot read the filters of dataset '{}' (damaged file?)", path_, name);
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0, filter_config = 0;
    size_t values = 0;
    char filter_name[64] = {};
    const H5Z_filter_t id = H5Pget_filter2(dcpl.get(), static_cast<unsigned>(i), &flags, &values, nullptr,
                                           sizeof(filter_name), filter_name, &filter_config);
    const bool decodes = id >= 0 && H5Zfilter_avail(id) > 0 && H5Zget_filter_info(id, &filter_config) >= 0 &&
                         (filter_config & H5Z_FILTER_CONFIG_DECODE_ENABLED) != 0;
    HYDRA_USER_CHECK(decodes, "{}: dataset '{}' is stored through HDF5 filter {} ('{}'), which this hydra's HDF5 library "
                     "cannot decode (h5py's lzf, filter 32000, is a plugin): write it uncompressed or with gzip", path_,
                     name, static_cast<int>(id), filter_name);
  }
  Handle type(H5Dget_type(dataset), H5Tclose);
  const hsize_t element = type.ok() ? H5Tget_size(type.get()) : 0;
  const hsize_t needed = static_cast<hsize_t>(checked_numel(info.shape)) * element;
  const hsize_t stored = H5Dget_storage_size(dataset);
  hsize_t file_size = 0;
  HYDRA_USER_CHECK(H5Fget_filesize(id_, &file_size) >= 0, "{}: cannot read the file's size", path_);
  if (layout == H5D_CHUNKED) {
    const int rank = static_cast<int>(info.shape.size());
    hsize_t chunk[kMaxRank] = {};
    HYDRA_USER_CHECK(rank >= 1 && H5Pget_chunk(dcpl.get(), rank, chunk) == rank,
                     "{}: cannot read the chunk shape of dataset '{}' (damaged file?)", path_, name);
    hsize_t expected = 1;
    std::string chunk_text;
    for (int d = 0; d < rank; ++d) {
      HYDRA_USER_CHECK(chunk[d] >= 1, "{}: dataset '{}' declares an empty chunk (damaged file?)", path_, name);
      const hsize_t extent = static_cast<hsize_t>(info.shape[static_cast<size_t>(d)]);
      expected *= (extent + chunk[d] - 1) / chunk[d];  // ≤ the element count: no overflow
      chunk_text += fmt::format("{}{}", d ? ", " : "", chunk[d]);
    }
    hsize_t allocated = 0;
    Handle space(H5Dget_space(dataset), H5Sclose);
    HYDRA_USER_CHECK(space.ok() && H5Dget_num_chunks(dataset, space.get(), &allocated) >= 0,
                     "{}: cannot count the chunks of dataset '{}' (damaged file?)", path_, name);
    HYDRA_USER_CHECK(allocated == expected, "{}: dataset '{}' of shape {} in chunks of [{}] holds {} of its {} chunks: "
                     "the others were never written (HDF5 would read them as zeros; damaged or truncated file?)",
                     path_, name, format_shape(info.shape), chunk_text, allocated, expected);
    HYDRA_USER_CHECK(stored <= file_size, "{}: dataset '{}' stores {} bytes, more than the file's {} (truncated file?)",
                     path_, name, stored, file_size);
    return;
  }
  HYDRA_USER_CHECK(stored == needed, "{}: dataset '{}' stores {} bytes, its shape {} needs {} (damaged or truncated "
                   "file?)", path_, name, stored, format_shape(info.shape), needed);
  if (layout == H5D_CONTIGUOUS && needed > 0) {
    const haddr_t offset = H5Dget_offset(dataset);
    HYDRA_USER_CHECK(offset != HADDR_UNDEF && offset <= file_size && needed <= file_size - offset,
                     "{}: dataset '{}' lies past the end of the file (truncated file?)", path_, name);
  }
}

void H5File::read_into(const std::string& name, const TensorView& out) const {
  const DatasetInfo info = dataset_info(name);
  HYDRA_ASSERT(out.on_host() && out.is_contiguous(), "read_into needs a contiguous host view");
  HYDRA_USER_CHECK(std::equal(info.shape.begin(), info.shape.end(), out.shape().begin(), out.shape().end()),
                   "{}: dataset '{}' has shape {}, expected {}", path_, name,
                   format_shape(info.shape), out.shape_string());
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  check_storage(dataset.get(), info, name);
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
                          : src->dtype() == DType::f64  ? H5T_IEEE_F64LE
                                                        : H5T_STD_I64LE;
  Handle dataset(H5Dcreate2(id_, name.c_str(), file_type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot create dataset '{}'", path_, name);
  HYDRA_USER_CHECK(H5Dwrite(dataset.get(), memory_type(src->dtype()), H5S_ALL, H5S_ALL, H5P_DEFAULT,
                            src->data()) >= 0,
                   "{}: writing dataset '{}' failed (disk full or over a file size limit?)", destination_of(path_),
                   name);
  if (src->dtype() == DType::bf16) {
    Handle scalar(H5Screate(H5S_SCALAR), H5Sclose);
    Handle type(H5Tcopy(H5T_C_S1), H5Tclose);
    H5Tset_size(type.get(), 8);
    Handle attr(H5Acreate2(dataset.get(), "dtype", type.get(), scalar.get(), H5P_DEFAULT, H5P_DEFAULT), H5Aclose);
    HYDRA_USER_CHECK(attr.ok() && H5Awrite(attr.get(), type.get(), "bfloat16") >= 0,
                     "{}: cannot tag dataset '{}' as bfloat16", path_, name);
  }
}

namespace {

// h5py writes numpy bool as an HDF5 enum {FALSE = 0, TRUE = 1} over a 1-byte integer.
bool is_bool_enum(hid_t type) {
  if (H5Tget_class(type) != H5T_ENUM || H5Tget_size(type) != 1 || H5Tget_nmembers(type) != 2) return false;
  for (unsigned i = 0; i < 2; ++i) {
    int8_t value = -1;
    if (H5Tget_member_value(type, i, &value) < 0 || value != static_cast<int8_t>(i)) return false;
  }
  return true;
}

bool is_integer_type(hid_t type) {
  return (H5Tget_class(type) == H5T_INTEGER && H5Tget_size(type) <= 8) || is_bool_enum(type);
}

}  // namespace

bool H5File::is_integer_vector(const std::string& name) const {
  if (!has_dataset(name)) return false;
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  if (!dataset.ok()) return false;
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  return type.ok() && space.ok() && is_integer_type(type.get()) && H5Sget_simple_extent_ndims(space.get()) == 1;
}

std::vector<int64_t> H5File::read_integer_vector(const std::string& name) const {
  HYDRA_USER_CHECK(has_dataset(name), "{}: dataset '{}' is missing", path_, name);
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  HYDRA_USER_CHECK(type.ok() && is_integer_type(type.get()), "{}: dataset '{}' is not an integer (or boolean) dataset",
                   path_, name);
  const bool boolean = is_bool_enum(type.get());
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  HYDRA_USER_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, "{}: dataset '{}' must be 1-D", path_, name);
  hsize_t n = 0;
  HYDRA_USER_CHECK(H5Sget_simple_extent_dims(space.get(), &n, nullptr) >= 0 && n <= static_cast<hsize_t>(kMaxElements),
                   "{}: cannot read the shape of dataset '{}' (damaged file?)", path_, name);
  const DatasetInfo info{.shape = {static_cast<int64_t>(n)}, .dtype = DType::i64};
  check_storage(dataset.get(), info, name);
  check_fits_in_memory(path_, name, info);
  std::vector<int64_t> values(static_cast<size_t>(n));
  if (n > 0 && boolean) {
    // HDF5 converts no enum to an integer: read the enum's own bytes (0 or 1 by is_bool_enum).
    std::vector<int8_t> bytes(static_cast<size_t>(n));
    Handle memory(H5Tget_native_type(type.get(), H5T_DIR_ASCEND), H5Tclose);
    HYDRA_USER_CHECK(memory.ok() && H5Dread(dataset.get(), memory.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, bytes.data()) >= 0,
                     "{}: reading dataset '{}' failed (truncated file?)", path_, name);
    std::copy(bytes.begin(), bytes.end(), values.begin());
  } else if (n > 0) {
    HYDRA_USER_CHECK(H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0,
                     "{}: reading dataset '{}' failed (truncated file?)", path_, name);
  }
  return values;
}

H5File::IntegerVectorInfo H5File::integer_vector_info(const std::string& name) const {
  HYDRA_USER_CHECK(has_dataset(name), "{}: dataset '{}' is missing", path_, name);
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  HYDRA_USER_CHECK(type.ok() && is_integer_type(type.get()), "{}: dataset '{}' is not an integer (or boolean) dataset",
                   path_, name);
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  HYDRA_USER_CHECK(H5Sget_simple_extent_ndims(space.get()) == 1, "{}: dataset '{}' must be 1-D", path_, name);
  hsize_t n = 0;
  HYDRA_USER_CHECK(H5Sget_simple_extent_dims(space.get(), &n, nullptr) >= 0 && n <= static_cast<hsize_t>(kMaxElements),
                   "{}: cannot read the shape of dataset '{}' (damaged file?)", path_, name);
  IntegerVectorInfo info;
  info.length = static_cast<int64_t>(n);
  info.width = static_cast<int>(H5Tget_size(type.get()));
  // A boolean's bytes are 0 or 1 (is_bool_enum): read as an unsigned byte.
  info.is_signed = !is_bool_enum(type.get()) && H5Tget_sign(type.get()) == H5T_SGN_2;
  // The storage checks of a whole read (check_storage: sizes agree with the shape, every chunk
  // written, filters decodable, values in this file), before any range is read.
  check_storage(dataset.get(), DatasetInfo{.shape = {info.length}, .dtype = info.width == 8 ? DType::i64 : DType::i32},
                name);
  Handle dcpl(H5Dget_create_plist(dataset.get()), H5Pclose);
  HYDRA_USER_CHECK(dcpl.ok(), "{}: cannot read the layout of dataset '{}' (damaged file?)", path_, name);
  if (H5Pget_layout(dcpl.get()) == H5D_CONTIGUOUS && n > 0) {
    const bool little = info.width == 1 || H5Tget_order(type.get()) == H5T_ORDER_LE;
    if (little && H5Pget_nfilters(dcpl.get()) == 0) info.file_offset = static_cast<int64_t>(H5Dget_offset(dataset.get()));
  }
  return info;
}

void H5File::read_range(const std::string& name, int64_t first, int64_t count, int64_t memory_type, void* out) const {
  if (count == 0) return;
  Handle dataset(H5Dopen2(id_, name.c_str(), local_links()), H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot open dataset '{}'", path_, name);
  Handle space(H5Dget_space(dataset.get()), H5Sclose);
  hsize_t n = 0;
  H5Sget_simple_extent_dims(space.get(), &n, nullptr);
  HYDRA_ASSERT(first >= 0 && count >= 0 && static_cast<hsize_t>(first + count) <= n, "{}: '{}' [{}, +{}) of {}", path_,
               name, first, count, n);
  const hsize_t start[1] = {static_cast<hsize_t>(first)}, size[1] = {static_cast<hsize_t>(count)};
  HYDRA_USER_CHECK(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, size, nullptr) >= 0,
                   "{}: cannot select [{}, +{}) of dataset '{}'", path_, first, count, name);
  Handle memory(H5Screate_simple(1, size, nullptr), H5Sclose);
  Handle type(H5Dget_type(dataset.get()), H5Tclose);
  if (type.ok() && is_bool_enum(type.get())) {
    // HDF5 converts no enum to an integer: read the enum's own bytes (0 or 1) and widen them.
    std::vector<uint8_t> bytes(static_cast<size_t>(count));
    Handle native(H5Tget_native_type(type.get(), H5T_DIR_ASCEND), H5Tclose);
    HYDRA_USER_CHECK(native.ok() && H5Dread(dataset.get(), native.get(), memory.get(), space.get(), H5P_DEFAULT,
                                            bytes.data()) >= 0,
                     "{}: reading [{}, +{}) of dataset '{}' failed (truncated file?)", path_, first, count, name);
    const auto widen = [&](auto* to) { std::copy(bytes.begin(), bytes.end(), to); };
    if (memory_type == static_cast<int64_t>(H5T_NATIVE_INT64)) widen(static_cast<int64_t*>(out));
    else if (memory_type == static_cast<int64_t>(H5T_NATIVE_INT32)) widen(static_cast<int32_t*>(out));
    else widen(static_cast<uint8_t*>(out));
    return;
  }
  HYDRA_USER_CHECK(H5Dread(dataset.get(), static_cast<hid_t>(memory_type), memory.get(), space.get(), H5P_DEFAULT, out) >= 0,
                   "{}: reading [{}, +{}) of dataset '{}' failed (truncated file?)", path_, first, count, name);
}

void H5File::read_integer_range(const std::string& name, int64_t first, std::span<int64_t> out) const {
  read_range(name, first, static_cast<int64_t>(out.size()), H5T_NATIVE_INT64, out.data());
}
void H5File::read_integer_range(const std::string& name, int64_t first, std::span<int32_t> out) const {
  read_range(name, first, static_cast<int64_t>(out.size()), H5T_NATIVE_INT32, out.data());
}
void H5File::read_integer_range(const std::string& name, int64_t first, std::span<uint8_t> out) const {
  read_range(name, first, static_cast<int64_t>(out.size()), H5T_NATIVE_UINT8, out.data());
}

void H5File::write_uint8(const std::string& name, std::span<const uint8_t> values) {
  const hsize_t dims[1] = {static_cast<hsize_t>(values.size())};
  Handle space(H5Screate_simple(1, dims, nullptr), H5Sclose);
  Handle dataset(H5Dcreate2(id_, name.c_str(), H5T_STD_U8LE, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                 H5Dclose);
  HYDRA_USER_CHECK(dataset.ok(), "{}: cannot create dataset '{}'", path_, name);
  HYDRA_USER_CHECK(H5Dwrite(dataset.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()) >= 0,
                   "{}: writing dataset '{}' failed (disk full or over a file size limit?)", destination_of(path_),
                   name);
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
  std::string value, problem;
  HYDRA_USER_CHECK(read_string_attribute(id_, name.c_str(), value, problem), "{}: attribute '{}' {}", path_, name,
                   problem);
  return value;
}

int64_t H5File::int_attribute(const std::string& name) const {
  HYDRA_USER_CHECK(has_attribute(name), "{}: attribute '{}' is missing", path_, name);
  Handle attr(H5Aopen(id_, name.c_str(), H5P_DEFAULT), H5Aclose);
  HYDRA_USER_CHECK(attr.ok() && holds_one_element(attr.get()), "{}: attribute '{}' is not a single value", path_, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  HYDRA_USER_CHECK(H5Tget_class(type.get()) == H5T_INTEGER, "{}: attribute '{}' is not an integer", path_, name);
  int64_t value = 0;
  HYDRA_USER_CHECK(H5Aread(attr.get(), H5T_NATIVE_INT64, &value) >= 0, "{}: cannot read attribute '{}'", path_, name);
  return value;
}

double H5File::double_attribute(const std::string& name) const {
  HYDRA_USER_CHECK(has_attribute(name), "{}: attribute '{}' is missing", path_, name);
  Handle attr(H5Aopen(id_, name.c_str(), H5P_DEFAULT), H5Aclose);
  HYDRA_USER_CHECK(attr.ok() && holds_one_element(attr.get()), "{}: attribute '{}' is not a single value", path_, name);
  Handle type(H5Aget_type(attr.get()), H5Tclose);
  const H5T_class_t cls = H5Tget_class(type.get());
  HYDRA_USER_CHECK(cls == H5T_FLOAT || cls == H5T_INTEGER, "{}: attribute '{}' is not a number", path_, name);
  double value = 0;
  HYDRA_USER_CHECK(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value) >= 0, "{}: cannot read attribute '{}'", path_, name);
  return value;
}

}  // namespace hydra
