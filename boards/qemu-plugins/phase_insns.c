/*
 * edgetrain: a QEMU TCG plugin (user mode, one vCPU) that splits the guest's instruction
 * count into phases. A phase starts each time the guest enters one of the addresses given
 * as arguments (entry=ADDR:LABEL, ADDR in hex, a guest virtual address: a function's start);
 * every instruction executed after that, including in shared libraries the function calls,
 * belongs to that phase until the next listed entry. The entry marked step=ADDR starts a new
 * step (and a phase named "step"). At exit it prints, for each phase position within a step,
 * the label and the mean instructions per step over steps 2..N (step 1 warms up nothing here,
 * but operator set-up inside the first step is excluded this way), one line each:
 *   phase <position> <label> <mean insns per step>
 * plus "steps <N>", "total_per_step <sum>" and the smallest and largest whole step of
 * steps 2..N-1 ("step_min <insns>", "step_max <insns>": how much steps differ).
 *
 * Marks instead of addresses (for a guest whose code has no fixed address, e.g. a Python
 * program): with syscall=NR, a system call NR whose first argument is one listed as
 * mark=VALUE:LABEL (or stepmark=VALUE, which starts a step) starts a phase exactly as an
 * entry does. boards/torch_step.py makes them with os.close(VALUE) on a descriptor number no
 * process can have open (close fails with EBADF and has no other effect); the few hundred
 * instructions of that Python call land in the phases around it. Both kinds may be mixed.
 *
 * Built by boards/count-instructions.sh with gcc against glib and qemu-plugin.h from Debian's
 * qemu source package. Written for edgetrain; uses only the public plugin API.
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define MAX_PHASES 256

typedef struct {
    uint64_t addr;
    char *label;
} Entry;

static GArray *entries;          /* Entry */
static uint64_t step_addr;
static GArray *marks;            /* Entry, addr = the syscall's first argument */
static int64_t mark_syscall = -1;
static uint64_t step_mark;
static bool have_step_mark;
static uint64_t step_begin;      /* counter when the current step began */
static uint64_t step_min = UINT64_MAX, step_max;
static uint64_t counter;         /* instructions so far (inline, per TB) */
static uint64_t phase_start;     /* counter when the current phase began */
static int position = -1;        /* phase position within the current step, -1 before step 1 */
static uint64_t steps;
static const char *labels[MAX_PHASES];
static uint64_t sums[MAX_PHASES];  /* over steps 2..N */
static int max_position;

static void close_phase(void)
{
    if (position >= 0 && position < MAX_PHASES && steps >= 2) {
        sums[position] += counter - phase_start;
    }
    phase_start = counter;
}

static void start_phase(const Entry *e, bool starts_step)
{
    close_phase();
    if (starts_step) {
        /* Step k-1 just ended; steps 2..N-1 are the whole ones. */
        if (steps >= 2) {
            uint64_t n = counter - step_begin;
            step_min = n < step_min ? n : step_min;
            step_max = n > step_max ? n : step_max;
        }
        step_begin = counter;
        steps++;
        position = 0;
    } else if (position >= 0) {
        position++;
    }
    if (position >= 0 && position < MAX_PHASES) {
        labels[position] = e->label;
        if (position > max_position) {
            max_position = position;
        }
    }
}

static void on_entry(unsigned int vcpu_index, void *udata)
{
    Entry *e = udata;
    start_phase(e, step_addr && e->addr == step_addr);
}

static void on_syscall(qemu_plugin_id_t id, unsigned int vcpu_index, int64_t num, uint64_t a1,
                       uint64_t a2, uint64_t a3, uint64_t a4, uint64_t a5, uint64_t a6,
                       uint64_t a7, uint64_t a8)
{
    if (num != mark_syscall) {
        return;
    }
    for (guint i = 0; i < marks->len; i++) {
        Entry *e = &g_array_index(marks, Entry, i);
        if (e->addr == a1) {
            start_phase(e, have_step_mark && a1 == step_mark);
            return;
        }
    }
}

static void vcpu_tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    uint64_t vaddr = qemu_plugin_tb_vaddr(tb);
    for (guint i = 0; i < entries->len; i++) {
        Entry *e = &g_array_index(entries, Entry, i);
        if (e->addr == vaddr) {
            qemu_plugin_register_vcpu_tb_exec_cb(tb, on_entry, QEMU_PLUGIN_CB_NO_REGS, e);
            break;
        }
    }
    qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counter,
                                             qemu_plugin_tb_n_insns(tb));
}

static void plugin_exit(qemu_plugin_id_t id, void *p)
{
    /* The last step's last phase runs until exit: it is not counted. */
    g_autoptr(GString) out = g_string_new("");
    uint64_t total = 0;
    uint64_t n = steps > 2 ? steps - 2 : 0; /* steps 2..N-1 are complete */
    g_string_append_printf(out, "steps %" PRIu64 "\n", steps);
    if (n > 0) {
        for (int i = 0; i <= max_position && i < MAX_PHASES; i++) {
            /* The last step's phases are summed too, except the one cut off at exit. */
            uint64_t mean = sums[i] / (i < position ? n + 1 : n);
            total += mean;
            g_string_append_printf(out, "phase %d %s %" PRIu64 "\n", i, labels[i], mean);
        }
    }
    g_string_append_printf(out, "total_per_step %" PRIu64 "\n", total);
    if (step_max > 0) {
        g_string_append_printf(out, "step_min %" PRIu64 "\nstep_max %" PRIu64 "\n", step_min,
                               step_max);
    }
    qemu_plugin_outs(out->str);
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    entries = g_array_new(false, true, sizeof(Entry));
    marks = g_array_new(false, true, sizeof(Entry));
    for (int i = 0; i < argc; i++) {
        g_auto(GStrv) tokens = g_strsplit(argv[i], "=", 2);
        if (!tokens[0] || !tokens[1]) {
            fprintf(stderr, "phase_insns: bad argument %s\n", argv[i]);
            return -1;
        }
        if (g_strcmp0(tokens[0], "step") == 0) {
            Entry e = { g_ascii_strtoull(tokens[1], NULL, 16), g_strdup("step") };
            step_addr = e.addr;
            g_array_append_val(entries, e);
        } else if (g_strcmp0(tokens[0], "entry") == 0) {
            g_auto(GStrv) al = g_strsplit(tokens[1], ":", 2);
            if (!al[0] || !al[1]) {
                fprintf(stderr, "phase_insns: entry wants ADDR:LABEL, got %s\n", tokens[1]);
                return -1;
            }
            Entry e = { g_ascii_strtoull(al[0], NULL, 16), g_strdup(al[1]) };
            g_array_append_val(entries, e);
        } else if (g_strcmp0(tokens[0], "syscall") == 0) {
            mark_syscall = g_ascii_strtoll(tokens[1], NULL, 0);
        } else if (g_strcmp0(tokens[0], "stepmark") == 0) {
            Entry e = { g_ascii_strtoull(tokens[1], NULL, 0), g_strdup("step") };
            step_mark = e.addr;
            have_step_mark = true;
            g_array_append_val(marks, e);
        } else if (g_strcmp0(tokens[0], "mark") == 0) {
            g_auto(GStrv) al = g_strsplit(tokens[1], ":", 2);
            if (!al[0] || !al[1]) {
                fprintf(stderr, "phase_insns: mark wants VALUE:LABEL, got %s\n", tokens[1]);
                return -1;
            }
            Entry e = { g_ascii_strtoull(al[0], NULL, 0), g_strdup(al[1]) };
            g_array_append_val(marks, e);
        } else {
            fprintf(stderr, "phase_insns: unknown option %s\n", tokens[0]);
            return -1;
        }
    }
    if (!step_addr && !have_step_mark) {
        fprintf(stderr, "phase_insns: needs step=ADDR or stepmark=VALUE\n");
        return -1;
    }
    if (marks->len > 0 && mark_syscall < 0) {
        fprintf(stderr, "phase_insns: mark= and stepmark= need syscall=NR\n");
        return -1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, vcpu_tb_trans);
    if (marks->len > 0) {
        qemu_plugin_register_vcpu_syscall_cb(id, on_syscall);
    }
    qemu_plugin_register_atexit_cb(id, plugin_exit, NULL);
    return 0;
}
