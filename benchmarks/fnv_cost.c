/* What llama.cpp's RPC client spends hashing a cached tensor, against copying it (the warm-restart gap, docs/degraded.md).
 *
 *   cc -O3 -o /tmp/fnv_cost benchmarks/fnv_cost.c && /tmp/fnv_cost 513
 *
 * On a warm restart the RPC client (on main) hashes every weight tensor over the cache threshold with
 * FNV-1a, byte by byte, before it sends the hash (b11434 ggml-rpc.cpp `fnv_hash`, called from
 * `ggml_backend_rpc_buffer_set_tensor`); the node then reads its cache file into a zero-filled vector
 * and copies it into the buffer (`get_cached_file`, `set_tensor_hash`). This program times the same
 * loop as upstream's over N MiB in memory, and a zero-fill plus a copy of the same size, on this CPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t fnv_hash(const uint8_t *data, size_t len, uint64_t hash) {   /* as upstream's */
    const uint64_t fnv_prime = 0x100000001b3ULL;
    for (size_t i = 0; i < len; ++i) {
        hash ^= data[i];
        hash *= fnv_prime;
    }
    return hash;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 513, n = mib << 20;
    uint8_t *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) return 1;
    for (size_t i = 0; i < n; i++) src[i] = (uint8_t)(i * 2654435761u >> 24);
    double t0 = now();
    uint64_t h = fnv_hash(src, n, 0xcbf29ce484222325ULL);
    double t1 = now();
    memset(dst, 0, n);
    __asm__ volatile("" : : "r"(dst) : "memory");   /* the zero-fill happens, as upstream's resize */
    memcpy(dst, src, n);
    double t2 = now();
    printf("%zu MiB: fnv-1a %.3f s (hash %016llx), zero-fill + copy %.3f s (byte %u)\n", mib, t1 - t0,
           (unsigned long long)h, t2 - t1, dst[n / 3] ^ dst[n - 1]);   /* dst read: the copy is kept */
    free(src);
    free(dst);
    return 0;
}
