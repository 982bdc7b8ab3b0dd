/* Linked into every target of the sanitizer build only (cluster/sanitize.sh, CMake option
 * HYDRA_SANITIZE_KEEP_MODULES). Open MPI loads its components with dlopen and unloads them in
 * MPI_Finalize; LeakSanitizer reports at exit, when the allocation stacks of those components'
 * init-time allocations point into unmapped code and print as "<unknown module>", which no
 * suppression can name. Defining dlclose in the executable interposes it for every library: modules
 * stay mapped, their frames symbolize (mca_*.so, libopen-pal.so), and cluster/sanitize.supp
 * matches them. Nothing in hydra unloads a library, so nothing else changes. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
