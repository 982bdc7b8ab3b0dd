// A per-kernel time table for any CUDA program, without hardware counters: a CUDA injection
// library (loaded by the CUDA driver through CUDA_INJECTION64_PATH) that records every kernel,
// copy and memset through CUPTI's activity API and, at exit, prints the kernels grouped by name,
// longest total first.
//
//   CUDA_INJECTION64_PATH=build/lib/libhydra_kernel_profile.so HYDRA_KERNEL_PROFILE=profile.tsv hydra train ...
//
// HYDRA_KERNEL_PROFILE names the output file (unset: stderr). Columns: total ms, share of the
// kernels' summed time, launches, mean µs, name (demangled, template arguments cut at 160
// characters). CUPTI's activity records carry GPU start/end timestamps, so the times are the
// kernels' own durations; overlapping kernels (several streams) are each counted in full, and the
// header states the span from the first to the last record beside the summed time.
//
// Below the table: the GPU's idle time, the parts of the span covered by no kernel, copy or memset
// on any stream (time the GPU waited for the host: launches, synchronisations, host work), grouped
// by the record that ended before each gap and the one that started after it, longest total first.
//
// Why an injection library and not a link-time dependency: hydra itself needs no CUPTI, and the
// same library profiles the PyTorch reference scripts (python3 is a CUDA program too). PyTorch's
// own profiler uses the same CUPTI records (Kineto); this works where hardware counters do not
// (gVisor machines, where ncu cannot read them).
#include <cupti.h>
#include <cxxabi.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace {

struct Totals {
  uint64_t ns = 0;
  uint64_t count = 0;
};

struct Interval {
  uint64_t start, end;
  const std::string* name;  // a key of State::kernels, or one of the names below (stable addresses)
};

struct State {
  std::mutex mutex;
  std::map<std::string, Totals> kernels;
  std::vector<Interval> intervals;
  const std::string copy_name = "(copy)", memset_name = "(memset)";
  Totals copies, memsets;
  uint64_t first = UINT64_MAX, last = 0;
  uint64_t dropped = 0;
  uint64_t buffers = 0, bytes = 0;
};

State& state() {
  static State* s = new State;  // never destroyed: records may arrive during exit
  return *s;
}

std::string readable(const char* mangled) {
  if (!mangled) return "(unnamed)";
  int status = 0;
  char* out = abi::__cxa_demangle(mangled, nullptr, nullptr, &status);
  std::string name = status == 0 && out ? out : mangled;
  std::free(out);
  if (name.size() > 160) name = name.substr(0, 157) + "...";
  return name;
}

// One record of [start, end) into its totals and the span of all records.
void add(State& s, Totals& t, uint64_t start, uint64_t end) {
  t.ns += end - start;
  t.count += 1;
  s.first = std::min(s.first, start);
  s.last = std::max(s.last, end);
}

bool check(CUptiResult r, const char* what) {
  if (r == CUPTI_SUCCESS) return true;
  const char* text = nullptr;
  cuptiGetResultString(r, &text);
  std::fprintf(stderr, "kernel_profile: %s failed: %s\n", what, text ? text : "?");
  return false;
}

constexpr size_t kBufferBytes = 8u << 20;

void report();

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  // The exit handler is registered here, at the first record (after the program's first kernel),
  // not at load: handlers run in reverse order, so this one runs before the CUDA runtime's own,
  // which destroys the contexts (and, with them, the records not yet delivered).
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(report); });
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.buffers += 1;
  s.bytes += valid;
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL:
      case CUPTI_ACTIVITY_KIND_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        const auto entry = s.kernels.try_emplace(readable(k->name)).first;
        add(s, entry->second, k->start, k->end);
        s.intervals.push_back({k->start, k->end, &entry->first});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        add(s, s.copies, m->start, m->end);
        s.intervals.push_back({m->start, m->end, &s.copy_name});
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        add(s, s.memsets, m->start, m->end);
        s.intervals.push_back({m->start, m->end, &s.memset_name});
        break;
      }
      default:
        break;
    }
  }
  size_t dropped = 0;
  if (cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped) == CUPTI_SUCCESS) s.dropped += dropped;
  std::free(buffer);
}

// A kernel's name without its return type, scope and arguments ("conv_backward8_kernel<4>").
std::string short_name(const std::string& name) {
  if (name.empty() || name[0] == '(') return name;  // "(copy)", "(memset)"
  size_t open = 0;
  while ((open = name.find('(', open)) != std::string::npos && name.compare(open, 10, "(anonymous") == 0) ++open;
  const std::string head = name.substr(0, open);
  size_t begin = 0;
  int depth = 0;
  for (size_t i = 0; i + 1 < head.size(); ++i) {  // the last "::" outside template arguments
    if (head[i] == '<') ++depth;
    if (head[i] == '>') --depth;
    if (depth == 0 && head[i] == ':' && head[i + 1] == ':') begin = i + 2;
  }
  std::string out = head.substr(begin);
  if (out.rfind("void ", 0) == 0) out = out.substr(5);
  return out;
}

// Idle time: sweep the records in start order, keeping the latest end so far; a record starting
// after it opens a gap, charged to (the record that set that end, this record).
void report_idle(State& s, FILE* out) {
  std::sort(s.intervals.begin(), s.intervals.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::map<std::pair<const std::string*, const std::string*>, Totals> gaps;
  uint64_t idle = 0, reach = 0;
  const std::string* last = nullptr;
  for (const Interval& i : s.intervals) {
    if (last != nullptr && i.start > reach) {
      Totals& g = gaps[{last, i.name}];
      g.ns += i.start - reach;
      g.count += 1;
      idle += i.start - reach;
    }
    if (last == nullptr || i.end > reach) {
      reach = i.end;
      last = i.name;
    }
  }
  const double span = s.last > s.first ? static_cast<double>(s.last - s.first) : 0.0;
  std::fprintf(out, "# idle: %.3f ms of the %.3f ms span (%.1f%%) covered by no record; longest totals by the records "
                    "around each gap:\n",
               static_cast<double>(idle) / 1e6, span / 1e6, span > 0 ? 100.0 * static_cast<double>(idle) / span : 0.0);
  std::vector<std::pair<std::pair<const std::string*, const std::string*>, Totals>> rows(gaps.begin(), gaps.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  std::fprintf(out, "idle_ms\tgaps\tmean_us\tbefore -> after\n");
  for (size_t r = 0; r < rows.size() && r < 25; ++r) {
    const auto& [names, t] = rows[r];
    std::fprintf(out, "%.3f\t%llu\t%.1f\t%s -> %s\n", static_cast<double>(t.ns) / 1e6,
                 static_cast<unsigned long long>(t.count), static_cast<double>(t.ns) / 1e3 / static_cast<double>(t.count),
                 short_name(*names.first).c_str(), short_name(*names.second).c_str());
  }
}

void report() {
  check(cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED), "flushing at exit");
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  const char* path = std::getenv("HYDRA_KERNEL_PROFILE");
  FILE* out = path && *path ? std::fopen(path, "w") : stderr;
  if (!out) {
    std::fprintf(stderr, "kernel_profile: cannot write %s: %s\n", path, std::strerror(errno));
    out = stderr;
  }
  std::vector<std::pair<std::string, Totals>> rows(s.kernels.begin(), s.kernels.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  uint64_t sum = 0, launches = 0;
  for (const auto& [name, t] : rows) {
    sum += t.ns;
    launches += t.count;
  }
  const double span_ms = s.last > s.first ? static_cast<double>(s.last - s.first) / 1e6 : 0.0;
  std::fprintf(out, "# kernels: %llu launches, %.3f ms summed; span of all records %.3f ms; copies %llu (%.3f ms), "
                    "memsets %llu (%.3f ms); dropped records %llu; %llu buffers, %llu bytes\n",
               static_cast<unsigned long long>(launches), static_cast<double>(sum) / 1e6, span_ms,
               static_cast<unsigned long long>(s.copies.count), static_cast<double>(s.copies.ns) / 1e6,
               static_cast<unsigned long long>(s.memsets.count), static_cast<double>(s.memsets.ns) / 1e6,
               static_cast<unsigned long long>(s.dropped), static_cast<unsigned long long>(s.buffers),
               static_cast<unsigned long long>(s.bytes));
  std::fprintf(out, "total_ms\tshare\tlaunches\tmean_us\tkernel\n");
  for (const auto& [name, t] : rows) {
    std::fprintf(out, "%.3f\t%.4f\t%llu\t%.1f\t%s\n", static_cast<double>(t.ns) / 1e6,
                 sum ? static_cast<double>(t.ns) / static_cast<double>(sum) : 0.0,
                 static_cast<unsigned long long>(t.count), static_cast<double>(t.ns) / 1e3 / static_cast<double>(t.count),
                 name.c_str());
  }
  report_idle(s, out);
  if (out != stderr) std::fclose(out);
}

}  // namespace

// Called by the CUDA driver when it loads this library (CUDA_INJECTION64_PATH).
// The driver may call it more than once in a process; only the first call sets up.
extern "C" __attribute__((visibility("default"))) int InitializeInjection() {
  static bool initialised = false;
  if (initialised) return 1;
  initialised = true;
  if (!check(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed), "cuptiActivityRegisterCallbacks") ||
      !check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL), "enabling kernel records")) {
    std::fprintf(stderr, "kernel_profile: no profile will be written\n");
    return 0;
  }
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY), "enabling copy records");
  check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET), "enabling memset records");
  check(cuptiActivityFlushPeriod(500), "cuptiActivityFlushPeriod");
  std::fprintf(stderr, "kernel_profile: recording kernels, copies and memsets\n");
  return 1;
}
