/*
 * libnvidia-ml.so.1 for the fleetctl lab: the NVML calls fleetctl (through the real pynvml) and the usual
 * tools make, answered from the lab host's emulated kernel and hardware files (docs/lab.md).
 *
 * Built once per driver version by lab/fleetctl_lab/packages.py:
 *   gcc -shared -fPIC -O2 -Wall -Werror -DLAB_DRIVER_VERSION='"570.86.15"' -DLAB_FLAVOR='"open"' -I<gen> ...
 * where <gen>/lab_skus.h is generated from lab/fleetctl_lab/skus.py. Built once more with LAB_DRIVER_VERSION ""
 * for hosts whose driver comes from real distribution packages (fleetctl-lab-gpu, `+debian`): installed in
 * /usr/local/lib/x86_64-linux-gnu, ahead of the real library in the dynamic loader's search order, it answers for
 * the version of the real libnvidia-ml.so.1 the package manager installed (LAB_REAL_LIBRARY resolved: Debian's
 * alternatives end in .../nvidia/tesla-470/libnvidia-ml.so.470.256.02); none installed: NVML_ERROR_LIBRARY_NOT_FOUND.
 *
 * State is read at call time, under an optional root prefix ($NVIDIA_LAB_ROOT, default ""):
 *   /sys/module/nvidia/version           absent: NVML_ERROR_DRIVER_NOT_LOADED at init;
 *                                        != LAB_DRIVER_VERSION: NVML_ERROR_LIB_RM_VERSION_MISMATCH at init
 *   /var/lib/nvidia-lab/hw/gpus.conf     the GPUs (key=value, re-read at every query), their NVLink state
 *                                        (gpu.N.nvlink_down, gpu.N.nvlink_<counter>) and fabric_stuck
 *   /var/run/nvidia-fabricmanager/       nv-fabricmanager.pid and .version: the fabric of an NVSwitch board is
 *                                        completed only while that process runs at the loaded driver's version
 *   gpus.conf fabric.cluster_uuid, fabric.clique_id   a rack-scale tray in a multi-node NVLink domain (lab spec
 *                                        +domain=NAME): its GPUs' fabric is completed in that cluster and clique
 * A GPU with lost=1 still counts (the kernel driver still enumerates it, as on a real host), but
 * nvmlDeviceGetHandleByIndex_v2 on it and every query on a handle taken before it was lost answer
 * NVML_ERROR_GPU_IS_LOST.
 *
 * Types, struct layouts and return codes are those of nvml.h (checked against pynvml's ctypes definitions).
 * Only these symbols are exported (-fvisibility=hidden elsewhere).
 */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/time.h>
#include <unistd.h>

#include "lab_skus.h" /* struct lab_sku LAB_SKUS[], LAB_SKU_COUNT (generated) */

#ifndef LAB_DRIVER_VERSION
#error "build with -DLAB_DRIVER_VERSION=\"570.86.15\""
#endif
#define LAB_REAL_LIBRARY "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
#ifndef LAB_FLAVOR
#define LAB_FLAVOR "open"
#endif

#define API __attribute__((visibility("default")))

/* nvmlReturn_t and the other nvml.h enums are C enums: int-sized in the x86-64 ABI. */
typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};
typedef unsigned int nvmlEnableState_t; /* NVML_FEATURE_DISABLED 0 / ENABLED 1 */
enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_MEMORY_ERROR_TYPE_CORRECTED = 0, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1 };
enum { NVML_VOLATILE_ECC = 0, NVML_AGGREGATE_ECC = 1 };
enum { NVML_VALUE_TYPE_UNSIGNED_INT = 1, NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3 };
#define NVML_FI_DEV_GET_GPU_RECOVERY_ACTION 230
#define NVML_FI_DEV_NVLINK_LINK_COUNT 91
#define NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY 161
#define NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY 162
#define NVML_FI_DEV_NVLINK_ERROR_DL_CRC 163
#define NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS 214
#define NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS 219
#define NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS 221
/* nvmlNvLinkErrorCounter_t */
enum { NVML_NVLINK_ERROR_DL_REPLAY = 0, NVML_NVLINK_ERROR_DL_RECOVERY = 1, NVML_NVLINK_ERROR_DL_CRC_FLIT = 2,
       NVML_NVLINK_ERROR_DL_CRC_DATA = 3, NVML_NVLINK_ERROR_DL_ECC_DATA = 4, NVML_NVLINK_ERROR_COUNT = 5 };
enum { NVML_NVLINK_CAP_COUNT = 6 }; /* nvmlNvLinkCapability_t: P2P_SUPPORTED 0 .. VALID 5 */
enum { NVML_NVLINK_DEVICE_TYPE_GPU = 0, NVML_NVLINK_DEVICE_TYPE_SWITCH = 2 }; /* nvmlIntNvLinkDeviceType_t */
/* nvmlGpuTopologyLevel_t */
enum { NVML_TOPOLOGY_INTERNAL = 0, NVML_TOPOLOGY_NODE = 40, NVML_TOPOLOGY_SYSTEM = 50 };
/* nvmlGpuP2PCapsIndex_t, nvmlGpuP2PStatus_t */
enum { NVML_P2P_CAPS_INDEX_READ = 0, NVML_P2P_CAPS_INDEX_WRITE = 1, NVML_P2P_CAPS_INDEX_NVLINK = 2,
       NVML_P2P_CAPS_INDEX_ATOMICS = 3, NVML_P2P_CAPS_INDEX_PCI = 4, NVML_P2P_CAPS_INDEX_UNKNOWN = 5 };
enum { NVML_P2P_STATUS_OK = 0, NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED = 3, NVML_P2P_STATUS_NOT_SUPPORTED = 5 };
/* nvmlGpuFabricState_t */
enum { NVML_GPU_FABRIC_STATE_NOT_SUPPORTED = 0, NVML_GPU_FABRIC_STATE_NOT_STARTED = 1,
       NVML_GPU_FABRIC_STATE_IN_PROGRESS = 2, NVML_GPU_FABRIC_STATE_COMPLETED = 3 };

/* nvmlPciInfo_t as of NVML 9 (nvmlDeviceGetPciInfo_v3), pynvml's nvmlPciInfo_t:
 * offset 0 busIdLegacy[16] "%04X:%02X:%02X.0", 16 domain, 20 bus, 24 device, 28 pciDeviceId,
 * 32 pciSubSystemId, 36 busId[32] "%08X:%02X:%02X.0"; sizeof 68. */
typedef struct {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;    /* device id << 16 | vendor id (0x10de) */
    unsigned int pciSubSystemId; /* subsystem id << 16 | subsystem vendor */
    char busId[32];
} nvmlPciInfo_t;

/* nvmlMemory_t (v1): total, free, used in bytes; "used" includes what the driver reserves. */
typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

/* nvmlMemory_v2_t: version at 0, 4 bytes padding, then 4 x u64 at 8/16/24/32; sizeof 40.
 * nvmlMemory_v2 = NVML_STRUCT_VERSION(Memory, 2) = sizeof | 2 << 24 = 0x02000028. */
typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 (unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24))

/* nvmlValue_t: 8-byte union. */
typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

/* nvmlFieldValue_t: fieldId 0, scopeId 4, timestamp 8, latencyUsec 16, valueType 24, nvmlReturn 28,
 * value 32; sizeof 40 (pynvml c_nvmlFieldValue_t). */
typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp; /* microseconds since the epoch */
    long long latencyUsec;
    int valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

/* nvmlGpuFabricInfo_t (nvmlDeviceGetGpuFabricInfo, pynvml c_nvmlGpuFabricInfo_t): clusterUuid[16] 0, status 16,
 * cliqueId 20, state 24; sizeof 28. */
#define NVML_GPU_FABRIC_UUID_LEN 16
typedef struct {
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
} nvmlGpuFabricInfo_t;

/* nvmlGpuFabricInfo_v2_t (pynvml c_nvmlGpuFabricInfo_v2_t): version 0, clusterUuid 4, status 20, cliqueId 24,
 * state 28, healthMask 32; sizeof 36, nvmlGpuFabricInfo_v2 = 0x02000024. v3 adds healthSummary (u8) at 36: sizeof
 * 40, nvmlGpuFabricInfo_v3 = 0x03000028 (nvml.h's nvmlGpuFabricInfoV_t). */
typedef struct {
    unsigned int version;
    unsigned char clusterUuid[NVML_GPU_FABRIC_UUID_LEN];
    nvmlReturn_t status;
    unsigned int cliqueId;
    unsigned int state;
    unsigned int healthMask;
    unsigned char healthSummary; /* v3 only */
} nvmlGpuFabricInfo_v3_t;
#define NVML_GPU_FABRIC_INFO_V2 (unsigned int)(36 | (2 << 24))
#define NVML_GPU_FABRIC_INFO_V3 (unsigned int)(sizeof(nvmlGpuFabricInfo_v3_t) | (3 << 24))

_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t layout");
_Static_assert(offsetof(nvmlGpuFabricInfo_v3_t, healthMask) == 32, "nvmlGpuFabricInfo_v2_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 40, "nvmlGpuFabricInfo_v3_t layout");
_Static_assert(NVML_GPU_FABRIC_INFO_V2 == 0x02000024 && NVML_GPU_FABRIC_INFO_V3 == 0x03000028, "fabric versions");
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(offsetof(nvmlPciInfo_t, busId) == 36, "nvmlPciInfo_t.busId offset");
_Static_assert(sizeof(nvmlMemory_v2_t) == 40, "nvmlMemory_v2_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");
_Static_assert(offsetof(nvmlFieldValue_t, value) == 32, "nvmlFieldValue_t.value offset");

/* nvmlDevice_t is an opaque pointer in nvml.h; here it points at one of these slots. */
#define LAB_MAX_GPUS 64
typedef struct nvmlDevice_st {
    unsigned int index;
} *nvmlDevice_t;
static struct nvmlDevice_st lab_devices[LAB_MAX_GPUS];

/* ---- state files -------------------------------------------------------------------------------- */

struct lab_gpu {
    char name[96], uuid[96], serial[32], pci[32], vbios[32], inforom[32];
    unsigned long long persistence, ecc, ecc_pending, ecc_unc_volatile, ecc_unc_aggregate;
    unsigned long long remap_corr, remap_unc, remap_pending, remap_failure, mig, mig_pending;
    unsigned long long pcie_gen, pcie_gen_max, pcie_width, pcie_width_max, temp, power_mw, power_limit_mw;
    unsigned long long clock_events, recovery_action, lost, process;
    unsigned long long pcie_replays, mem_used_mib; /* lab inject pcie-errors / leaked-memory */
    /* NVLink: links trained down ("3,7") and per-link error counters ("LINK:COUNT,...") */
    char nvlink_down[256], nvlink_replay[256], nvlink_recovery[256], nvlink_crc_flit[256], nvlink_crc_data[256];
    char nvlink_symbol[256], nvlink_effective[256], nvlink_recovery_failed[256];
};

struct lab_hw {
    unsigned int count;
    unsigned int fabric_stuck; /* lab inject fabric-stuck: the fabric never completes */
    int in_domain;             /* fabric.cluster_uuid set: a tray of a multi-node NVLink domain */
    unsigned char cluster_uuid[NVML_GPU_FABRIC_UUID_LEN];
    unsigned int clique_id;
    const struct lab_sku *sku;
};

/* gpu.N.<key> -> field of struct lab_gpu; size 0 means a number. */
static const struct { const char *key; size_t off; size_t size; } LAB_KEYS[] = {
#define S(k) {#k, offsetof(struct lab_gpu, k), sizeof(((struct lab_gpu *)0)->k)}
#define N(k) {#k, offsetof(struct lab_gpu, k), 0}
    S(name), S(uuid), S(serial), S(pci), S(vbios), S(inforom),
    S(nvlink_down), S(nvlink_replay), S(nvlink_recovery), S(nvlink_crc_flit), S(nvlink_crc_data),
    S(nvlink_symbol), S(nvlink_effective), S(nvlink_recovery_failed),
    N(persistence), N(ecc), N(ecc_pending), N(ecc_unc_volatile), N(ecc_unc_aggregate),
    N(remap_corr), N(remap_unc), N(remap_pending), N(remap_failure), N(mig), N(mig_pending),
    N(pcie_gen), N(pcie_gen_max), N(pcie_width), N(pcie_width_max), N(temp), N(power_mw), N(power_limit_mw),
    N(clock_events), N(recovery_action), N(lost), N(process), N(pcie_replays), N(mem_used_mib),
#undef S
#undef N
};

static int lab_initialized;

static void lab_path(char *buf, size_t len, const char *path)
{
    const char *root = getenv("NVIDIA_LAB_ROOT");
    snprintf(buf, len, "%s%s", root ? root : "", path);
}

/* The driver version this library answers for: compiled in, or read from the real library (see the top). */
static const char *lab_driver_version(void)
{
    static char found[64];
    char path[4096], real[4096];
    const char *at;

    if (LAB_DRIVER_VERSION[0])
        return LAB_DRIVER_VERSION;
    lab_path(path, sizeof path, LAB_REAL_LIBRARY);
    /* under a non-empty $NVIDIA_LAB_ROOT the links must be relative: realpath follows absolute ones out of it */
    if (!realpath(path, real))
        return "";
    at = strrchr(real, '/') ? strrchr(real, '/') + 1 : real;
    if (strncmp(at, "libnvidia-ml.so.", strlen("libnvidia-ml.so.")) != 0)
        return "";
    snprintf(found, sizeof found, "%s", at + strlen("libnvidia-ml.so."));
    return strchr(found, '.') ? found : ""; /* libnvidia-ml.so.1 itself: no version in the name */
}

static char *lab_trim(char *s)
{
    char *end;
    while (isspace((unsigned char)*s))
        s++;
    end = s + strlen(s);
    while (end > s && isspace((unsigned char)end[-1]))
        *--end = '\0';
    return s;
}

static const struct lab_sku *lab_find_sku(const char *key)
{
    for (size_t i = 0; i < LAB_SKU_COUNT; i++)
        if (strcmp(LAB_SKUS[i].key, key) == 0)
            return &LAB_SKUS[i];
    return &LAB_SKUS[0];
}

/* "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" into 16 bytes; 0 when it is not a UUID. */
static int lab_parse_uuid(const char *text, unsigned char *out)
{
    unsigned int n = 0;
    for (const char *c = text; *c; c++) {
        if (*c == '-')
            continue;
        if (!isxdigit((unsigned char)c[0]) || !isxdigit((unsigned char)c[1]) || n == NVML_GPU_FABRIC_UUID_LEN)
            return 0;
        char byte[3] = {c[0], c[1], '\0'};
        out[n++] = (unsigned char)strtoul(byte, NULL, 16);
        c++;
    }
    return n == NVML_GPU_FABRIC_UUID_LEN;
}

/* Reads gpus.conf: the host's SKU and GPU count, and (index >= 0) that GPU's values over its SKU's defaults. */
static void lab_read_hw(struct lab_hw *hw, int index, struct lab_gpu *g)
{
    char path[4096], line[512];
    char sku_key[64] = "";
    unsigned int max_index = 0, count = 0, fabric_stuck = 0;
    int have_count = 0;
    memset(hw, 0, sizeof *hw);
    FILE *f;

    lab_path(path, sizeof path, "/var/lib/nvidia-lab/hw/gpus.conf");
    f = fopen(path, "r");
    if (g)
        memset(g, 0, sizeof *g);
    while (f && fgets(line, sizeof line, f)) {
        char *hash = strchr(line, '#'), *eq, *key, *value;
        if (hash)
            *hash = '\0';
        eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = '\0';
        key = lab_trim(line);
        value = lab_trim(eq + 1);
        if (strcmp(key, "sku") == 0) {
            snprintf(sku_key, sizeof sku_key, "%s", value);
        } else if (strcmp(key, "fabric_stuck") == 0) {
            fabric_stuck = (unsigned int)strtoul(value, NULL, 0) != 0;
        } else if (strcmp(key, "fabric.cluster_uuid") == 0) {
            hw->in_domain = lab_parse_uuid(value, hw->cluster_uuid);
        } else if (strcmp(key, "fabric.clique_id") == 0) {
            hw->clique_id = (unsigned int)strtoul(value, NULL, 0);
        } else if (strcmp(key, "count") == 0) {
            count = (unsigned int)strtoul(value, NULL, 0);
            have_count = 1;
        } else if (strncmp(key, "gpu.", 4) == 0) {
            char *rest;
            unsigned long n = strtoul(key + 4, &rest, 10);
            if (*rest != '.' || n >= LAB_MAX_GPUS)
                continue;
            if (n + 1 > max_index)
                max_index = (unsigned int)n + 1;
            if (!g || (int)n != index)
                continue;
            for (size_t k = 0; k < sizeof LAB_KEYS / sizeof LAB_KEYS[0]; k++) {
                if (strcmp(rest + 1, LAB_KEYS[k].key) != 0)
                    continue;
                char *field = (char *)g + LAB_KEYS[k].off;
                if (LAB_KEYS[k].size)
                    snprintf(field, LAB_KEYS[k].size, "%s", value);
                else
                    *(unsigned long long *)field = strtoull(value, NULL, 0) | (1ULL << 63); /* mark "set" */
            }
        }
    }
    if (f)
        fclose(f);
    hw->sku = lab_find_sku(sku_key);
    hw->fabric_stuck = fabric_stuck;
    hw->count = have_count ? count : max_index;
    if (hw->count > LAB_MAX_GPUS)
        hw->count = LAB_MAX_GPUS;
    if (!g)
        return;
    /* Numbers not in the file take the SKU's (or a healthy GPU's) value; bit 63 marked the ones that were. */
    const struct lab_sku *s = hw->sku;
    const unsigned long long defaults[][2] = {
        {offsetof(struct lab_gpu, persistence), 1}, {offsetof(struct lab_gpu, ecc), 1},
        {offsetof(struct lab_gpu, ecc_pending), 1}, {offsetof(struct lab_gpu, pcie_gen), s->pcie_gen},
        {offsetof(struct lab_gpu, pcie_gen_max), s->pcie_gen}, {offsetof(struct lab_gpu, pcie_width), s->pcie_width},
        {offsetof(struct lab_gpu, pcie_width_max), s->pcie_width}, {offsetof(struct lab_gpu, temp), 33},
        {offsetof(struct lab_gpu, power_mw), s->power_idle_mw}, {offsetof(struct lab_gpu, power_limit_mw), s->power_limit_mw},
        {offsetof(struct lab_gpu, clock_events), 1},
    };
    int mig_pending_set = (int)(g->mig_pending >> 63);
    for (size_t k = 0; k < sizeof LAB_KEYS / sizeof LAB_KEYS[0]; k++) {
        if (LAB_KEYS[k].size)
            continue;
        unsigned long long *v = (unsigned long long *)((char *)g + LAB_KEYS[k].off);
        if (*v & (1ULL << 63)) {
            *v &= ~(1ULL << 63);
            continue;
        }
        for (size_t d = 0; d < sizeof defaults / sizeof defaults[0]; d++)
            if (defaults[d][0] == LAB_KEYS[k].off)
                *v = defaults[d][1];
    }
    if (!mig_pending_set)
        g->mig_pending = g->mig; /* docs/lab.md's gpus.conf has mig only: pending follows current */
    if (!g->name[0])
        snprintf(g->name, sizeof g->name, "%s", s->name);
    if (!g->vbios[0])
        snprintf(g->vbios, sizeof g->vbios, "%s", s->vbios);
    if (!g->pci[0])
        snprintf(g->pci, sizeof g->pci, "00000000:%02X:00.0", 0x18 + index);
}

/* The loaded kernel module must be exactly this library's version (the real library checks with RM). */
static nvmlReturn_t lab_module_check(void)
{
    char path[4096], version[128] = "";
    FILE *f;

    lab_path(path, sizeof path, "/sys/module/nvidia/version");
    f = fopen(path, "r");
    if (!f)
        return NVML_ERROR_DRIVER_NOT_LOADED;
    if (!fgets(version, sizeof version, f))
        version[0] = '\0';
    fclose(f);
    return strcmp(lab_trim(version), lab_driver_version()) == 0 ? NVML_SUCCESS : NVML_ERROR_LIB_RM_VERSION_MISMATCH;
}

/* Checks a handle and reads its GPU. */
static nvmlReturn_t lab_dev(nvmlDevice_t dev, struct lab_hw *hw, struct lab_gpu *g)
{
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (dev < lab_devices || dev >= lab_devices + LAB_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    lab_read_hw(hw, (int)dev->index, g);
    if (dev->index >= hw->count || g->lost)
        return NVML_ERROR_GPU_IS_LOST;
    return NVML_SUCCESS;
}

/* Begins a device query: declares g/hw, checks the handle and the output pointer. */
#define QUERY(dev, out)                                     \
    struct lab_gpu g;                                       \
    struct lab_hw hw;                                       \
    nvmlReturn_t rc_ = lab_dev(dev, &hw, &g);               \
    if (rc_ != NVML_SUCCESS)                                \
        return rc_;                                         \
    if (!(out))                                             \
        return NVML_ERROR_INVALID_ARGUMENT;                 \
    (void)hw

static nvmlReturn_t lab_str(char *buf, unsigned int len, const char *value)
{
    if (!buf)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > len)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(buf, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

static unsigned int lab_branch(void)
{
    return (unsigned int)atoi(lab_driver_version());
}

/* ---- init, errors, system ----------------------------------------------------------------------- */

API nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t rc = lab_driver_version()[0] ? lab_module_check() : NVML_ERROR_LIBRARY_NOT_FOUND;
    if (rc == NVML_SUCCESS)
        lab_initialized++;
    return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
API nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

API nvmlReturn_t nvmlShutdown(void)
{
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    lab_initialized--;
    return NVML_SUCCESS;
}

API const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 3: return "Not Supported";
    case 4: return "Insufficient Permissions";
    case 5: return "Already Initialized";
    case 6: return "Not Found";
    case 7: return "Insufficient Size";
    case 8: return "Insufficient External Power";
    case 9: return "Driver Not Loaded";
    case 10: return "Timeout";
    case 11: return "Interrupt request issue";
    case 12: return "NVML Shared Library Not Found";
    case 13: return "Function Not Found";
    case 14: return "Corrupted infoROM";
    case 15: return "GPU is lost";
    case 16: return "GPU requires restart";
    case 17: return "The operating system has blocked the request.";
    case 18: return "RM has detected an NVML/RM version mismatch.";
    case 19: return "In use by another client";
    case 20: return "Insufficient Memory";
    case 21: return "No data";
    default: return "Unknown Error";
    }
}

API nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    return lab_str(version, length, lab_driver_version());
}

/* "12.570.86.15" for 550/570, "13.580.95.05" from 580 (the NVML major follows CUDA's). */
API nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
    char buf[80];
    snprintf(buf, sizeof buf, "%u.%s", lab_branch() >= 580 ? 13 : 12, lab_driver_version());
    return lab_str(version, length, buf);
}

/* CUDA version the driver supports, as 1000 * major + 10 * minor. */
API nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    static const unsigned int table[][2] = {{580, 13000}, {575, 12090}, {570, 12080}, {565, 12070}, {560, 12060},
                                            {555, 12050}, {550, 12040}, {545, 12030}, {535, 12020}, {530, 12010},
                                            {525, 12000}, {520, 11080}, {515, 11070}, {510, 11060}, {495, 11050},
                                            {470, 11040}, {0, 11000}};
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (lab_branch() >= table[i][0]) {
            *cudaDriverVersion = (int)table[i][1];
            break;
        }
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) { return nvmlSystemGetCudaDriverVersion_v2(v); }

/* ---- device handles ----------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    struct lab_hw hw;
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    lab_read_hw(&hw, -1, NULL);
    *deviceCount = hw.count; /* lost GPUs included */
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount) { return nvmlDeviceGetCount_v2(deviceCount); }

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct lab_hw hw;
    struct lab_gpu g;
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= LAB_MAX_GPUS)
        return NVML_ERROR_INVALID_ARGUMENT;
    lab_read_hw(&hw, (int)index, &g);
    if (index >= hw.count)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (g.lost)
        return NVML_ERROR_GPU_IS_LOST;
    lab_devices[index].index = index;
    *device = &lab_devices[index];
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

/* By UUID or PCI bus id (any case; 4- or 8-digit domain). */
static nvmlReturn_t lab_handle_by(const char *wanted, int by_pci, nvmlDevice_t *device)
{
    struct lab_hw hw;
    struct lab_gpu g;
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!wanted || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    lab_read_hw(&hw, -1, NULL);
    for (unsigned int i = 0; i < hw.count; i++) {
        lab_read_hw(&hw, (int)i, &g);
        const char *have = by_pci ? g.pci : g.uuid;
        size_t lw = strlen(wanted), lh = strlen(have);
        int match = by_pci ? (lw <= lh && strcasecmp(have + lh - lw, wanted) == 0 && lw >= 12)
                           : strcmp(have, wanted) == 0;
        if (!match)
            continue;
        if (g.lost)
            return NVML_ERROR_GPU_IS_LOST;
        lab_devices[i].index = i;
        *device = &lab_devices[i];
        return NVML_SUCCESS;
    }
    return NVML_ERROR_NOT_FOUND;
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    return lab_handle_by(uuid, 0, device);
}

API nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
    return lab_handle_by(pciBusId, 1, device);
}

/* ---- identity ----------------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length)
{
    QUERY(dev, name);
    return lab_str(name, length, g.name);
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length)
{
    QUERY(dev, uuid);
    return lab_str(uuid, length, g.uuid);
}

API nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *serial, unsigned int length)
{
    QUERY(dev, serial);
    return lab_str(serial, length, g.serial);
}

API nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *version, unsigned int length)
{
    QUERY(dev, version);
    return lab_str(version, length, g.vbios);
}

/* gpus.conf gpu.N.inforom (written by lab up from the SKU, changed by lab inject vbios); none: not supported */
API nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t dev, char *version, unsigned int length)
{
    QUERY(dev, version);
    if (!g.inforom[0])
        return NVML_ERROR_NOT_SUPPORTED;
    return lab_str(version, length, g.inforom);
}

API nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index)
{
    QUERY(dev, index);
    *index = dev->index;
    return NVML_SUCCESS;
}

/* /dev/nvidiaN: the lab numbers device nodes like NVML indexes. */
API nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minorNumber)
{
    QUERY(dev, minorNumber);
    *minorNumber = dev->index;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch)
{
    QUERY(dev, arch);
    *arch = hw.sku->arch;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci)
{
    unsigned int domain = 0, bus = 0, device = 0, function = 0;
    QUERY(dev, pci);
    if (sscanf(g.pci, "%x:%x:%x.%x", &domain, &bus, &device, &function) != 4)
        return NVML_ERROR_UNKNOWN;
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", domain & 0xffff, bus, device);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", domain, bus, device);
    pci->domain = domain;
    pci->bus = bus;
    pci->device = device;
    pci->pciDeviceId = hw.sku->pci_device_id;
    pci->pciSubSystemId = hw.sku->pci_subsystem_id;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(dev, pci); }

/* ---- modes and health --------------------------------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, nvmlEnableState_t *mode)
{
    QUERY(dev, mode);
    *mode = g.persistence ? 1 : 0;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
    QUERY(dev, current && pending);
    *current = g.ecc ? 1 : 0;
    *pending = g.ecc_pending ? 1 : 0;
    return NVML_SUCCESS;
}

/* Corrected counts are always 0 in the lab; uncorrected ones come from gpus.conf. With ECC off the counters
 * are not kept (NOT_SUPPORTED), as on a real GPU. */
API nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int errorType, int counterType,
                                             unsigned long long *eccCounts)
{
    QUERY(dev, eccCounts);
    if ((errorType != NVML_MEMORY_ERROR_TYPE_CORRECTED && errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED) ||
        (counterType != NVML_VOLATILE_ECC && counterType != NVML_AGGREGATE_ECC))
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!g.ecc)
        return NVML_ERROR_NOT_SUPPORTED;
    if (errorType == NVML_MEMORY_ERROR_TYPE_CORRECTED)
        *eccCounts = 0;
    else
        *eccCounts = counterType == NVML_VOLATILE_ECC ? g.ecc_unc_volatile : g.ecc_unc_aggregate;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corrRows, unsigned int *uncRows,
                                           unsigned int *isPending, unsigned int *failureOccurred)
{
    QUERY(dev, corrRows && uncRows && isPending && failureOccurred);
    *corrRows = (unsigned int)g.remap_corr;
    *uncRows = (unsigned int)g.remap_unc;
    *isPending = g.remap_pending ? 1 : 0;
    *failureOccurred = g.remap_failure ? 1 : 0;
    return NVML_SUCCESS;
}

/* Dynamic page retirement is pre-Ampere; every lab SKU (A100, L40S, H100, H200) remaps rows instead. */
API nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *pageCount,
                                           unsigned long long *addresses)
{
    (void)cause;
    (void)addresses;
    QUERY(dev, pageCount);
    return NVML_ERROR_NOT_SUPPORTED;
}

API nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, int cause, unsigned int *pageCount,
                                              unsigned long long *addresses, unsigned long long *timestamps)
{
    (void)timestamps;
    return nvmlDeviceGetRetiredPages(dev, cause, pageCount, addresses);
}

API nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, nvmlEnableState_t *isPending)
{
    QUERY(dev, isPending);
    return NVML_ERROR_NOT_SUPPORTED;
}

/* MIG: A100/H100/H200 only (not L40S). */
API nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *currentMode, unsigned int *pendingMode)
{
    QUERY(dev, currentMode && pendingMode);
    if (!hw.sku->mig)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = g.mig ? 1 : 0;
    *pendingMode = g.mig_pending ? 1 : 0;
    return NVML_SUCCESS;
}

/* ---- PCIe --------------------------------------------------------------------------------------- */

#define LAB_UINT_QUERY(fn, field)                                  \
    API nvmlReturn_t fn(nvmlDevice_t dev, unsigned int *out)       \
    {                                                              \
        QUERY(dev, out);                                           \
        *out = (unsigned int)g.field;                              \
        return NVML_SUCCESS;                                       \
    }

LAB_UINT_QUERY(nvmlDeviceGetPcieReplayCounter, pcie_replays)
LAB_UINT_QUERY(nvmlDeviceGetCurrPcieLinkGeneration, pcie_gen)
LAB_UINT_QUERY(nvmlDeviceGetMaxPcieLinkGeneration, pcie_gen_max)
LAB_UINT_QUERY(nvmlDeviceGetGpuMaxPcieLinkGeneration, pcie_gen_max)
LAB_UINT_QUERY(nvmlDeviceGetCurrPcieLinkWidth, pcie_width)
LAB_UINT_QUERY(nvmlDeviceGetMaxPcieLinkWidth, pcie_width_max)

/* ---- clocks, thermals, power, memory, processes ------------------------------------------------- */

API nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *reasons)
{
    QUERY(dev, reasons);
    *reasons = g.clock_events;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *reasons)
{
    return nvmlDeviceGetCurrentClocksEventReasons(dev, reasons);
}

API nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensorType, unsigned int *temp)
{
    QUERY(dev, temp);
    if (sensorType != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = (unsigned int)g.temp;
    return NVML_SUCCESS;
}

LAB_UINT_QUERY(nvmlDeviceGetPowerUsage, power_mw)
LAB_UINT_QUERY(nvmlDeviceGetEnforcedPowerLimit, power_limit_mw)
LAB_UINT_QUERY(nvmlDeviceGetPowerManagementLimit, power_limit_mw)

/* The driver reserves 480 MiB of every GPU (the real H100's); a running lab process (gpu.N.process) holds 1 GiB and a
 * leaked context (gpu.N.mem_used_mib, lab inject leaked-memory) what it leaked, with no process listed. */
#define LAB_RESERVED_BYTES (480ULL << 20)
#define LAB_PROCESS_BYTES (1ULL << 30)

static int lab_process_running(const struct lab_gpu *gpu)
{
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/%llu", gpu->process);
    return gpu->process && access(proc, F_OK) == 0;
}

static unsigned long long lab_used_bytes(const struct lab_gpu *gpu)
{
    return (gpu->mem_used_mib << 20) + (lab_process_running(gpu) ? LAB_PROCESS_BYTES : 0);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *memory)
{
    QUERY(dev, memory);
    memory->total = hw.sku->memory_total;
    memory->used = LAB_RESERVED_BYTES + lab_used_bytes(&g);
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *memory)
{
    QUERY(dev, memory);
    if (memory->version != NVML_MEMORY_V2)
        return 25; /* NVML_ERROR_ARGUMENT_VERSION_MISMATCH */
    memory->total = hw.sku->memory_total;
    memory->reserved = LAB_RESERVED_BYTES;
    memory->used = lab_used_bytes(&g);
    memory->free = memory->total - memory->reserved - memory->used;
    return NVML_SUCCESS;
}

/* A lab GPU runs at most one process: gpus.conf gpu.N.process=PID (lab inject gpu-in-use), listed while that pid
 * lives in the host. nvmlProcessInfo_v2_t and _v3_t share one layout (pid, usedGpuMemory, GPU/compute instance). */
struct lab_process_info {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
};

static nvmlReturn_t lab_processes(nvmlDevice_t dev, unsigned int *infoCount, void *infos)
{
    unsigned int running;
    QUERY(dev, infoCount);
    running = lab_process_running(&g);
    if (*infoCount < running || (running && !infos)) {
        *infoCount = running;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *infoCount = running;
    if (running) {
        struct lab_process_info *p = infos;
        p->pid = (unsigned int)g.process;
        p->usedGpuMemory = LAB_PROCESS_BYTES;
        p->gpuInstanceId = p->computeInstanceId = 0xFFFFFFFF;
    }
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *infos)
{
    return lab_processes(d, n, infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *n, void *infos)
{
    return lab_processes(d, n, infos);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned int *n, void *infos)
{
    return lab_processes(d, n, infos);
}
API nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t d, unsigned int *n, void *infos)
{
    (void)infos;
    QUERY(d, n);
    *n = 0;
    return NVML_SUCCESS;
}

/* ---- NVLink ------------------------------------------------------------------------------------- */

/* Every NVLink of a lab GPU goes to one of its board's NVSwitches (sku->nvswitch_links: links per switch, in link
 * order; NVSwitch s is at PCI 00000000:(05+s):00.0, as the kernel's /proc/driver/nvidia-nvswitch lists them). A
 * GPU without NVLink answers NOT_SUPPORTED for any link; a link number past its links INVALID_ARGUMENT. */
static nvmlReturn_t lab_link_check(const struct lab_hw *hw, unsigned int link)
{
    if (!hw->sku->nvlinks)
        return NVML_ERROR_NOT_SUPPORTED;
    return link < hw->sku->nvlinks ? NVML_SUCCESS : NVML_ERROR_INVALID_ARGUMENT;
}

/* Is LINK in the comma list SPEC ("3,7")? */
static int lab_link_listed(const char *spec, unsigned int link)
{
    const char *p = spec;
    while (*p) {
        char *end;
        unsigned long n = strtoul(p, &end, 10);
        if (end != p && n == link)
            return 1;
        p = strchr(end, ',');
        if (!p)
            break;
        p++;
    }
    return 0;
}

/* LINK's count in "LINK:COUNT,..." (the sum when a link is listed more than once; 0 when absent). */
static unsigned long long lab_link_count(const char *spec, unsigned int link)
{
    unsigned long long total = 0;
    const char *p = spec;
    while (*p) {
        char *end;
        unsigned long n = strtoul(p, &end, 10);
        if (end != p && *end == ':' && n == link)
            total += strtoull(end + 1, NULL, 10);
        p = strchr(end, ',');
        if (!p)
            break;
        p++;
    }
    return total;
}

static unsigned int lab_links_up(const struct lab_hw *hw, const struct lab_gpu *g)
{
    unsigned int up = 0;
    for (unsigned int l = 0; l < hw->sku->nvlinks; l++)
        up += !lab_link_listed(g->nvlink_down, l);
    return up;
}

/* Begins an NVLink query: QUERY plus the link's checks. */
#define LINK_QUERY(dev, link, out)                          \
    QUERY(dev, out);                                        \
    rc_ = lab_link_check(&hw, link);                        \
    if (rc_ != NVML_SUCCESS)                                \
        return rc_

API nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, nvmlEnableState_t *isActive)
{
    LINK_QUERY(dev, link, isActive);
    *isActive = lab_link_listed(g.nvlink_down, link) ? 0 : 1;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t dev, unsigned int link, unsigned int *version)
{
    LINK_QUERY(dev, link, version);
    *version = hw.sku->nvlink_version;
    return NVML_SUCCESS;
}

/* P2P, system memory access, P2P and system memory atomics, SLI bridge, valid: all true on the lab's SXM boards
 * (the real H200 capture's `nvidia-smi nvlink -c`). */
API nvmlReturn_t nvmlDeviceGetNvLinkCapability(nvmlDevice_t dev, unsigned int link, int capability,
                                               unsigned int *capResult)
{
    LINK_QUERY(dev, link, capResult);
    if (capability < 0 || capability >= NVML_NVLINK_CAP_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    *capResult = 1;
    return NVML_SUCCESS;
}

/* The remote end of an active link: an NVSwitch. A link that is down has none (NOT_SUPPORTED). */
static unsigned int lab_link_switch(const struct lab_sku *sku, unsigned int link)
{
    unsigned int first = 0;
    for (unsigned int s = 0; s < sku->nvswitch_count; s++) {
        first += sku->nvswitch_links[s];
        if (link < first)
            return s;
    }
    return sku->nvswitch_count ? sku->nvswitch_count - 1 : 0;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci)
{
    LINK_QUERY(dev, link, pci);
    if (lab_link_listed(g.nvlink_down, link))
        return NVML_ERROR_NOT_SUPPORTED;
    unsigned int bus = 0x05 + lab_link_switch(hw.sku, link);
    memset(pci, 0, sizeof *pci);
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "%04X:%02X:%02X.0", 0, bus, 0);
    snprintf(pci->busId, sizeof pci->busId, "%08X:%02X:%02X.0", 0, bus, 0);
    pci->bus = bus;
    /* NVSwitch: LS10 (third generation, Hopper boards) 0x22A3, else the A100 boards' 0x1AF1 */
    pci->pciDeviceId = hw.sku->nvlink_version >= 6 ? 0x22A310DE : 0x1AF110DE;
    return NVML_SUCCESS;
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t dev, unsigned int link, nvmlPciInfo_t *pci)
{
    return nvmlDeviceGetNvLinkRemotePciInfo_v2(dev, link, pci);
}

API nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t dev, unsigned int link, int *type)
{
    LINK_QUERY(dev, link, type);
    if (lab_link_listed(g.nvlink_down, link))
        return NVML_ERROR_NOT_SUPPORTED;
    *type = hw.sku->nvswitch_count ? NVML_NVLINK_DEVICE_TYPE_SWITCH : NVML_NVLINK_DEVICE_TYPE_GPU;
    return NVML_SUCCESS;
}

/* What the legacy DL_CRC_DATA / DL_ECC_DATA counters read on a healthy NVLink 4 link: the real 2x H200
 * (tests/testdata/h200x2-580.159.04) showed 0-36 on every link while nvidia-smi and the field values said 0 (data
 * errors corrected by ECC). Fixed per GPU UUID, link and counter. */
static unsigned long long lab_link_noise(const struct lab_hw *hw, const struct lab_gpu *g, unsigned int link, int counter)
{
    unsigned int h = 2166136261u;
    if (hw->sku->nvlink_version < 6)
        return 0;
    for (const char *c = g->uuid; *c; c++)
        h = (h ^ (unsigned char)*c) * 16777619u;
    h = (h ^ link) * 16777619u;
    h = (h ^ (unsigned int)counter) * 16777619u;
    return h % 37;
}

/* DL error counters; volatile (a driver load restarts them: the lab supervisor rewrites gpus.conf). */
API nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, int counter,
                                                 unsigned long long *counterValue)
{
    LINK_QUERY(dev, link, counterValue);
    switch (counter) {
    case NVML_NVLINK_ERROR_DL_REPLAY: *counterValue = lab_link_count(g.nvlink_replay, link); break;
    case NVML_NVLINK_ERROR_DL_RECOVERY: *counterValue = lab_link_count(g.nvlink_recovery, link); break;
    case NVML_NVLINK_ERROR_DL_CRC_FLIT: *counterValue = lab_link_count(g.nvlink_crc_flit, link); break;
    case NVML_NVLINK_ERROR_DL_CRC_DATA:
        *counterValue = lab_link_count(g.nvlink_crc_data, link) + lab_link_noise(&hw, &g, link, counter);
        break;
    case NVML_NVLINK_ERROR_DL_ECC_DATA: *counterValue = lab_link_noise(&hw, &g, link, counter); break;
    default: return NVML_ERROR_INVALID_ARGUMENT;
    }
    return NVML_SUCCESS;
}

/* ---- NVSwitch fabric ---------------------------------------------------------------------------- */

/* Is nv-fabricmanager running at VERSION? Its pid file names a live process whose argv[0] is nv-fabricmanager,
 * and the version file it writes next to it says VERSION. */
static int lab_fabric_manager_at(const char *version)
{
    char path[4096], buf[256] = "";
    unsigned long pid = 0;
    FILE *f;

    lab_path(path, sizeof path, "/var/run/nvidia-fabricmanager/nv-fabricmanager.pid");
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (fgets(buf, sizeof buf, f))
        pid = strtoul(buf, NULL, 10);
    fclose(f);
    if (!pid)
        return 0;
    snprintf(path, sizeof path, "/proc/%lu/cmdline", pid);
    f = fopen(path, "r");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *base = strrchr(buf, '/');
    if (strcmp(base ? base + 1 : buf, "nv-fabricmanager") != 0)
        return 0;
    lab_path(path, sizeof path, "/var/run/nvidia-fabricmanager/nv-fabricmanager.version");
    f = fopen(path, "r");
    if (!f)
        return 0;
    if (!fgets(buf, sizeof buf, f))
        buf[0] = '\0';
    fclose(f);
    return strcmp(lab_trim(buf), version) == 0;
}

/* completed on a tray of a multi-node NVLink domain (the rack's switch trays run its fabric); else not_supported off
 * an NVSwitch board; completed only while the fabric manager runs at this (the loaded) driver's
 * version and no fabric-stuck fault holds it; in_progress otherwise. */
static unsigned int lab_fabric_state(const struct lab_hw *hw)
{
    if (hw->in_domain)
        return NVML_GPU_FABRIC_STATE_COMPLETED; /* the rack's switch trays run the fabric, not this tray */
    if (!hw->sku->nvswitch)
        return NVML_GPU_FABRIC_STATE_NOT_SUPPORTED;
    if (hw->fabric_stuck || !lab_fabric_manager_at(lab_driver_version()))
        return NVML_GPU_FABRIC_STATE_IN_PROGRESS;
    return NVML_GPU_FABRIC_STATE_COMPLETED;
}

/* The legacy call: on the real H200 with driver 580 it answered not_supported where the V call and nvidia-smi said
 * completed (docs/interconnect.md); the lab's Hopper boards do the same from branch 580 on. */
API nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t dev, nvmlGpuFabricInfo_t *info)
{
    QUERY(dev, info);
    memset(info, 0, sizeof *info); /* cluster UUID zero, clique 0: a single HGX board */
    info->state = lab_branch() >= 580 && hw.sku->nvlink_version >= 6 ? NVML_GPU_FABRIC_STATE_NOT_SUPPORTED
                                                                      : lab_fabric_state(&hw);
    if (hw.in_domain && info->state == NVML_GPU_FABRIC_STATE_COMPLETED) {
        memcpy(info->clusterUuid, hw.cluster_uuid, sizeof info->clusterUuid);
        info->cliqueId = hw.clique_id;
    }
    info->status = NVML_SUCCESS;
    return NVML_SUCCESS;
}

/* nvmlGpuFabricInfo_v2 or _v3 in info->version; anything else ARGUMENT_VERSION_MISMATCH. The health mask's fields are
 * all NOT_SUPPORTED (0), as on the real H200 board (its Health section is N/A throughout). */
API nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t dev, nvmlGpuFabricInfo_v3_t *info)
{
    QUERY(dev, info);
    unsigned int version = info->version;
    if (version != NVML_GPU_FABRIC_INFO_V2 && version != NVML_GPU_FABRIC_INFO_V3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    memset(info, 0, version == NVML_GPU_FABRIC_INFO_V2 ? 36 : sizeof *info);
    info->version = version;
    info->state = lab_fabric_state(&hw);
    if (hw.in_domain) { /* else cluster UUID zero, clique 0: a single HGX board */
        memcpy(info->clusterUuid, hw.cluster_uuid, sizeof info->clusterUuid);
        info->cliqueId = hw.clique_id;
    }
    info->status = NVML_SUCCESS;
    return NVML_SUCCESS;
}

/* ---- topology and P2P --------------------------------------------------------------------------- */

/* Two CPU sockets; GPUs 0..n/2-1 on the first, all of them with 1 or 2 GPUs (lab/fleetctl_lab/skus.py socket_of),
 * each under its own PCIe host bridge: the same socket is NODE, across sockets SYSTEM. */
static unsigned int lab_socket(unsigned int index, unsigned int count)
{
    return count <= 2 ? 0 : index * 2 / count;
}

API nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t dev1, nvmlDevice_t dev2, int *pathInfo)
{
    struct lab_gpu g2;
    QUERY(dev1, pathInfo);
    rc_ = lab_dev(dev2, &hw, &g2);
    if (rc_ != NVML_SUCCESS)
        return rc_;
    if (dev1->index == dev2->index)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (lab_socket(dev1->index, hw.count) == lab_socket(dev2->index, hw.count))
        *pathInfo = NVML_TOPOLOGY_NODE;
    else
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    return NVML_SUCCESS;
}

/* NVSwitch boards: every capability OK between two GPUs with links up while the fabric is completed (nothing
 * works before: NOT_SUPPORTED); a GPU with every link down falls back to PCIe. PCIe: read, write and PCI OK within
 * a socket, not across (IOH topology not supported); no NVLink; no atomics. */
API nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t dev1, nvmlDevice_t dev2, int p2pIndex, int *p2pStatus)
{
    struct lab_gpu g2;
    QUERY(dev1, p2pStatus);
    rc_ = lab_dev(dev2, &hw, &g2);
    if (rc_ != NVML_SUCCESS)
        return rc_;
    if (p2pIndex < 0 || p2pIndex >= NVML_P2P_CAPS_INDEX_UNKNOWN || dev1->index == dev2->index)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (hw.sku->nvswitch && lab_fabric_state(&hw) != NVML_GPU_FABRIC_STATE_COMPLETED) {
        *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
        return NVML_SUCCESS;
    }
    if (hw.sku->nvlinks && lab_links_up(&hw, &g) && lab_links_up(&hw, &g2)) {
        *p2pStatus = NVML_P2P_STATUS_OK;
        return NVML_SUCCESS;
    }
    if (p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK || p2pIndex == NVML_P2P_CAPS_INDEX_ATOMICS)
        *p2pStatus = NVML_P2P_STATUS_NOT_SUPPORTED;
    else if (lab_socket(dev1->index, hw.count) == lab_socket(dev2->index, hw.count))
        *p2pStatus = NVML_P2P_STATUS_OK;
    else
        *p2pStatus = NVML_P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

/* ---- field values ------------------------------------------------------------------------------- */

/* NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and the per-link NVLink error fields (scopeId = link: DL replay, recovery,
 * CRC; recovery failed events, symbol errors, effective errors) and NVML_FI_DEV_NVLINK_LINK_COUNT are answered; other
 * fields get NOT_SUPPORTED in their nvmlReturn. */
API nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int valuesCount, nvmlFieldValue_t *values)
{
    struct timeval now;
    QUERY(dev, values);
    if (valuesCount < 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    gettimeofday(&now, NULL);
    for (int i = 0; i < valuesCount; i++) {
        nvmlFieldValue_t *v = &values[i];
        v->timestamp = (long long)now.tv_sec * 1000000 + now.tv_usec;
        v->latencyUsec = 0;
        v->value.ullVal = 0;
        if (v->fieldId == NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = NVML_SUCCESS;
            v->value.uiVal = (unsigned int)g.recovery_action;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            /* the GPU's NVLinks (18 on the real H200); a GPU without NVLink: NOT_SUPPORTED */
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = hw.sku->nvlinks ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
            v->value.uiVal = hw.sku->nvlinks;
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY || v->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY ||
                   v->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_CRC) {
            /* what `nvidia-smi nvlink -e` shows: Replay, Recovery, CRC (the flit CRC counter) */
            const char *spec = v->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY ? g.nvlink_replay
                             : v->fieldId == NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY ? g.nvlink_recovery
                             : g.nvlink_crc_flit;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->nvmlReturn = lab_link_check(&hw, v->scopeId);
            if (v->nvmlReturn == NVML_SUCCESS)
                v->value.ullVal = lab_link_count(spec, v->scopeId);
        } else if (v->fieldId == NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS ||
                   v->fieldId == NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS ||
                   v->fieldId == NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS) {
            const char *spec = v->fieldId == NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS ? g.nvlink_symbol
                             : v->fieldId == NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS ? g.nvlink_effective
                             : g.nvlink_recovery_failed;
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_LONG_LONG;
            v->nvmlReturn = lab_link_check(&hw, v->scopeId);
            if (v->nvmlReturn == NVML_SUCCESS)
                v->value.ullVal = lab_link_count(spec, v->scopeId);
        } else {
            v->valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            v->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

/* Which build this is (not an NVML symbol; for `strings` and debugging). */
API const char lab_nvml_build[] = "fleetctl lab NVML " LAB_DRIVER_VERSION " " LAB_FLAVOR;


/* ---- events: nvmlEventSet_t is opaque; a set remembers which devices registered which event types ----------
 * The lab's faults reach the kernel log (/dev/kmsg), not a running NVML listener: a wait sleeps out its timeout
 * and answers NVML_ERROR_TIMEOUT, as real NVML does when no event arrives. */
typedef struct {
    unsigned long long types[LAB_MAX_GPUS];
} *nvmlEventSet_t;

API nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    *set = calloc(1, sizeof(**set));
    return *set ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

API nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
    struct lab_hw hw;
    struct lab_gpu g;
    nvmlReturn_t ret = lab_dev(device, &hw, &g);
    if (ret != NVML_SUCCESS)
        return ret;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    set->types[device->index] |= eventTypes;
    return NVML_SUCCESS;
}

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlEventData_t;

API nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    if (!lab_initialized)
        return NVML_ERROR_UNINITIALIZED;
    if (!set || !data)
        return NVML_ERROR_INVALID_ARGUMENT;
    usleep((useconds_t)(timeoutms < 5000 ? timeoutms : 5000) * 1000);
    return NVML_ERROR_TIMEOUT;
}

API nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
    return nvmlEventSetWait_v2(set, data, timeoutms);
}

API nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    free(set);
    return NVML_SUCCESS;
}
