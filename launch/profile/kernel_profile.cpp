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
// HYDRA_KERNEL_PROFILE_HOST=1 also records the host's CUDA runtime and driver API calls (each call
// costs a little more) and says where the host was during those gaps: per API function, the time
// its calls overlapped an idle gap; what no call covers is host code between calls (the
// program's own work, or a library's between its CUDA calls). The runtime and driver tables are
// separate (a runtime call usually wraps driver calls).
//
// Why an injection library and not a link-time dependency: hydra itself needs no CUPTI, and the
// same library profiles the PyTorch reference scripts (python3 is a CUDA program too). PyTorch's
// own profiler uses the same CUPTI records (Kineto); this works where hardware counters do not
// (gVisor machines, where ncu cannot read them).
#include <cupti.h>
#include <cxxabi.h>

#include <cerrno>

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

struct ApiCall {
  uint64_t start, end;
  CUpti_CallbackId cbid;
  bool driver;
};

struct State {
  std::mutex mutex;
  std::vector<ApiCall> api_calls;
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
      case CUPTI_ACTIVITY_KIND_RUNTIME:
      case CUPTI_ACTIVITY_KIND_DRIVER: {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        s.api_calls.push_back({a->start, a->end, a->cbid, record->kind == CUPTI_ACTIVITY_KIND_DRIVER});
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

// A stretch of GPU time covered by no record, and the records that end before and start after it.
struct Gap {
  uint64_t start, end;
  const std::string *before, *after;
};

// Where the host was while the GPU idled: each API call's overlap with the idle spans, summed per
// function (runtime and driver apart), and the idle time no call of a domain covers.
void report_host(State& s, const std::vector<Gap>& idle_spans, uint64_t idle, FILE* out) {
  std::sort(s.api_calls.begin(), s.api_calls.end(), [](const ApiCall& a, const ApiCall& b) { return a.start < b.start; });
  for (const bool driver : {false, true}) {
    std::map<CUpti_CallbackId, Totals> by_call;  // ns: overlap with idle time; count: calls that overlapped
    uint64_t covered = 0;
    size_t first = 0;  // the first gap that may still overlap a call starting at or after the current one
    uint64_t covered_to = 0;  // calls of one domain do not nest, but guard against double counting
    for (const ApiCall& c : s.api_calls) {
      if (c.driver != driver) continue;
      while (first < idle_spans.size() && idle_spans[first].end <= c.start) ++first;
      uint64_t overlap = 0;
      for (size_t g = first; g < idle_spans.size() && idle_spans[g].start < c.end; ++g) {
        const uint64_t b = std::max({idle_spans[g].start, c.start, covered_to}), e = std::min(idle_spans[g].end, c.end);
        if (e > b) overlap += e - b;
      }
      covered_to = std::max(covered_to, c.end);
      if (overlap == 0) continue;
      Totals& t = by_call[c.cbid];
      t.ns += overlap;
      t.count += 1;
      covered += overlap;
    }
    std::vector<std::pair<CUpti_CallbackId, Totals>> rows(by_call.begin(), by_call.end());
    std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    const CUpti_CallbackDomain domain = driver ? CUPTI_CB_DOMAIN_DRIVER_API : CUPTI_CB_DOMAIN_RUNTIME_API;
    std::fprintf(out, "# host during the idle time, %s API: %.3f ms in calls, %.3f ms outside any %s call\n",
                 driver ? "driver" : "runtime", static_cast<double>(covered) / 1e6,
                 static_cast<double>(idle - std::min(idle, covered)) / 1e6, driver ? "driver" : "runtime");
    std::fprintf(out, "idle_ms\tcalls\tmean_us\tfunction\n");
    for (size_t r = 0; r < rows.size() && r < 12; ++r) {
      const char* name = nullptr;
      if (cuptiGetCallbackName(domain, rows[r].first, &name) != CUPTI_SUCCESS || !name) name = "?";
      std::fprintf(out, "%.3f\t%llu\t%.1f\t%s\n", static_cast<double>(rows[r].second.ns) / 1e6,
                   static_cast<unsigned long long>(rows[r].second.count),
                   static_cast<double>(rows[r].second.ns) / 1e3 / static_cast<double>(rows[r].second.count), name);
    }
  }
}

// The runtime calls that started in one idle gap (and the last three before it), in host order, with
// their start relative to the gap's start and their duration: what the host did while the GPU waited.
void report_gap_calls(const State& s, const Gap& gap, FILE* out) {
  std::fprintf(out, "# one gap of %s -> %s: %.1f us; runtime calls from the last three before it (start relative to "
                    "the gap, duration):\n", short_name(*gap.before).c_str(), short_name(*gap.after).c_str(),
               static_cast<double>(gap.end - gap.start) / 1e3);
  const auto first = std::lower_bound(s.api_calls.begin(), s.api_calls.end(), gap.start,
                                      [](const ApiCall& c, uint64_t t) { return c.start < t; });
  auto it = first;
  for (int back = 0; back < 3 && it != s.api_calls.begin();) {  // context: the last runtime calls before the gap
    --it;
    if (!it->driver) ++back;
  }
  for (; it != s.api_calls.end() && it->start < gap.end; ++it) {
    if (it->driver) continue;
    const char* name = nullptr;
    if (cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, it->cbid, &name) != CUPTI_SUCCESS || !name) name = "?";
    std::fprintf(out, "  %+9.1f us  %8.1f us  %s\n", (static_cast<double>(it->start) - static_cast<double>(gap.start)) / 1e3,
                 static_cast<double>(it->end - it->start) / 1e3, name);
  }
}

// Idle time: sweep the records in start order, keeping the latest end so far; a record starting
// after it opens a gap, charged to (the record that set that end, this record).
void report_idle(State& s, FILE* out) {
  std::sort(s.intervals.begin(), s.intervals.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
  std::map<std::pair<const std::string*, const std::string*>, Totals> gaps;
  std::vector<Gap> idle_spans;  // every gap, in order
  uint64_t idle = 0, reach = 0;
  const std::string* last = nullptr;
  for (const Interval& i : s.intervals) {
    if (last != nullptr && i.start > reach) {
      Totals& g = gaps[{last, i.name}];
      g.ns += i.start - reach;
      g.count += 1;
      idle += i.start - reach;
      idle_spans.push_back({reach, i.start, last, i.name});
    }
    if (last == nullptr || i.end > reach) {
      reach = i.end;
      last = i.name;
    }
  }
  const double span = s.last > s.first ? static_cast<double>(s.last - s.first) : 0.0;
  std::vector<Gap> longest = idle_spans;
  std::sort(longest.begin(), longest.end(), [](const Gap& a, const Gap& b) { return a.end - a.start > b.end - b.start; });
  // The longest single gaps first, with their place in the span: start-up (lazy module loading, the
  // first allocations) and step boundaries (loss and norm read back, logging) are one gap each and
  // can hold most of the idle time; the table after them groups every gap.
  std::fprintf(out, "# the longest idle gaps: ms after the first record, length ms, before -> after\n");
  for (size_t g = 0; g < longest.size() && g < 10; ++g) {
    std::fprintf(out, "#   %10.3f  %8.3f  %s -> %s\n", static_cast<double>(longest[g].start - s.first) / 1e6,
                 static_cast<double>(longest[g].end - longest[g].start) / 1e6, short_name(*longest[g].before).c_str(),
                 short_name(*longest[g].after).c_str());
  }
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
  if (!s.api_calls.empty()) {
    report_host(s, idle_spans, idle, out);
    // The host's calls through the three longest gaps.
    for (size_t g = 0; g < longest.size() && g < 3; ++g) report_gap_calls(s, longest[g], out);
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
  const char* host = std::getenv("HYDRA_KERNEL_PROFILE_HOST");
  const bool api = host && std::strcmp(host, "1") == 0;
  if (api) {
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME), "enabling runtime API records");
    check(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_DRIVER), "enabling driver API records");
  }
  check(cuptiActivityFlushPeriod(500), "cuptiActivityFlushPeriod");
  std::fprintf(stderr, "kernel_profile: recording kernels, copies and memsets%s\n", api ? " and the host's API calls" : "");
  return 1;
}
