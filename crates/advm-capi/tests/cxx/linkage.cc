// A C++ program calls the C API and links against libadvm: the headers' extern "C"
// gives every function its C name (a syntax check alone would not see a mangled one).
#include <advm.h>
#include <advm_gc.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

int main() {
    advm_gc *gc = advm_gc_new(1 << 20);
    if (gc == nullptr) return 1;
    void *list = nullptr;
    if (advm_gc_root(gc, &list) != 0) return 2;
    for (int i = 0; i < 1000; i++) {
        void **cell = static_cast<void **>(advm_gc_alloc(gc, 1, 8));
        if (cell == nullptr) return 3;
        cell[0] = list;
        list = cell;
    }
    if (advm_gc_collect(gc, 1) != 0) return 4;
    struct advm_gc_stats s;
    if (advm_gc_stats(gc, &s) != 0 || s.collections != 1) return 5;
    if (advm_gc_set_engine(gc, "bogus") != -EINVAL || errno != EINVAL) return 6;
    advm_gc_destroy(gc);
    struct advm_pager_stats ps;
    if (advm_pager_stats(nullptr, &ps) != -EINVAL) return 7;
    struct advm_remap_stats rs;
    std::memset(&rs, 0, sizeof rs);
    if (advm_move_stats(nullptr, nullptr, 4096, &rs) != -EINVAL) return 8;
    std::printf("C++ linkage: libadvm %s, %llu collection\n", advm_version(),
                static_cast<unsigned long long>(s.collections));
    return 0;
}
