/*
 * A qemu TCG plugin that counts the guest instructions a linux-user program executes
 * (`cargo xtask arm-count` builds it with the host gcc into target/qemu-plugin/ and loads it with
 * `qemu-aarch64 -plugin target/qemu-plugin/libinsn_count.so,out=FILE`).
 *
 * Each translated block gets one inline "add its instruction count to a 64-bit counter" op, so the
 * count costs almost nothing at run time. The count is written to `out=FILE` (or standard error) as
 * one decimal line when the guest exits. The inline op is not atomic: the count is exact for a guest
 * that runs one thread of computation (the benches run with one thread).
 *
 * With `tbs=FILE` it also counts each translated block's executions (one more inline add into the
 * block's own record) and writes `FIRST-PC` on the first line (the first block translated: the
 * program's entry point, from which a caller finds where a static-pie binary was loaded) and then one
 * line `PC INSNS EXECUTIONS` per translation (in hexadecimal, decimal, decimal) at exit, so that a
 * caller can attribute instructions to the binary's symbols (`cargo xtask arm-count --where`).
 *
 * Only the few entry points used are declared here, with the signatures of qemu's plugin API as
 * of version 1 (qemu 4.2 to 8.1; Debian 12 ships qemu 7.2).
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdlib.h>
#include <pthread.h>

#define EXPORT __attribute__((visibility("default")))

typedef uint64_t qemu_plugin_id_t;
typedef struct {
    const char *target_name;
    struct {
        int min;
        int cur;
    } version;
    bool system_emulation;
    union {
        struct {
            int smp_vcpus;
            int max_vcpus;
        } system;
    };
} qemu_info_t;
struct qemu_plugin_tb;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };

typedef void (*tb_trans_cb_t)(qemu_plugin_id_t id, struct qemu_plugin_tb *tb);
typedef void (*udata_cb_t)(qemu_plugin_id_t id, void *userdata);

void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, tb_trans_cb_t cb);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, enum qemu_plugin_op op,
                                              void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, udata_cb_t cb, void *userdata);

EXPORT int qemu_plugin_version = 1;

static uint64_t insns;
static const char *out_path;

/* `tbs=FILE`: one record per translation, in chunks that never move (the inline ops point into them). */
struct tb_rec {
    uint64_t pc;
    uint64_t n_insns;
    uint64_t execs;
};
#define CHUNK 65536
struct chunk {
    struct chunk *next;
    size_t used;
    struct tb_rec recs[CHUNK];
};
static const char *tbs_path;
static struct chunk *chunks;
static pthread_mutex_t tbs_lock = PTHREAD_MUTEX_INITIALIZER;

static struct tb_rec *new_rec(void)
{
    if (!chunks || chunks->used == CHUNK) {
        struct chunk *c = calloc(1, sizeof(struct chunk));
        if (!c) {
            return NULL;
        }
        c->next = chunks;
        chunks = c;
    }
    return &chunks->recs[chunks->used++];
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    (void)id;
    size_t n = qemu_plugin_tb_n_insns(tb);
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &insns, n);
    if (!tbs_path) {
        return;
    }
    pthread_mutex_lock(&tbs_lock);
    struct tb_rec *r = new_rec();
    if (r) {
        r->pc = qemu_plugin_tb_vaddr(tb);
        r->n_insns = n;
    }
    pthread_mutex_unlock(&tbs_lock);
    if (r) {
        qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &r->execs, 1);
    }
}

static void write_tbs(void)
{
    FILE *f = fopen(tbs_path, "w");
    if (!f) {
        fprintf(stderr, "insn_count: cannot write %s\n", tbs_path);
        return;
    }
    /* The oldest chunk holds the first translation. */
    struct chunk *first = chunks;
    while (first && first->next) {
        first = first->next;
    }
    fprintf(f, "%llx\n", first ? (unsigned long long)first->recs[0].pc : 0ULL);
    for (struct chunk *c = chunks; c; c = c->next) {
        for (size_t i = 0; i < c->used; i++) {
            if (c->recs[i].execs) {
                fprintf(f, "%llx %llu %llu\n", (unsigned long long)c->recs[i].pc,
                        (unsigned long long)c->recs[i].n_insns,
                        (unsigned long long)c->recs[i].execs);
            }
        }
    }
    fclose(f);
}

static void at_guest_exit(qemu_plugin_id_t id, void *userdata)
{
    (void)id;
    (void)userdata;
    FILE *f = out_path ? fopen(out_path, "w") : stderr;
    if (!f) {
        fprintf(stderr, "insn_count: cannot write %s\n", out_path);
        f = stderr;
    }
    fprintf(f, "%llu\n", (unsigned long long)insns);
    if (f != stderr) {
        fclose(f);
    }
    if (tbs_path) {
        write_tbs();
    }
}

EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                               char **argv)
{
    (void)info;
    for (int i = 0; i < argc; i++) {
        if (strncmp(argv[i], "out=", 4) == 0) {
            out_path = argv[i] + 4;
        } else if (strncmp(argv[i], "tbs=", 4) == 0) {
            tbs_path = argv[i] + 4;
        } else {
            fprintf(stderr, "insn_count: unknown argument %s (out=FILE, tbs=FILE)\n", argv[i]);
            return 1;
        }
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, at_guest_exit, NULL);
    return 0;
}
