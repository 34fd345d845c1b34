/* The credential screen of translator/shapes.py in one pass over the text: the compiled build's.

   screen(low) answers what shapes.screen_chain(low) answers, for a text of any length: whether
   the lowercased text holds a literal that some credential shape needs (never a miss; masking
   then looks closer). The Python chain reads the text again for each literal, some twenty scans;
   this reads it once, and looks closer only where two characters start a literal. shapes.py
   stays the reference and the source build's screen: setup.py builds this module only with the
   compiled translator, and tests/compiled checks that both answer alike. Every read of the text
   is within its length. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* What the text holds, as far as it has been read. */
enum {
    KEYED = 1 << 0,      /* "=" or ":": a NAME=value pair may stand in it */
    NAMED = 1 << 1,      /* a keyword such a NAME holds */
    AT = 1 << 2,         /* "@" */
    SCHEME = 1 << 3,     /* "://" */
    DASH = 1 << 4,       /* "-" */
    XOX = 1 << 5,        /* "xox" */
    UNDERSCORE = 1 << 6, /* "_" */
    GH = 1 << 7,         /* "gh" */
    DOT = 1 << 8,        /* "." */
    EYJ = 1 << 9,        /* "eyj" */
    HIT = 1 << 10,       /* a literal that alone may start a credential */
};

/* The literals of shapes.screen_chain and what each adds. "token" counts only where no "s"
   follows it (usage counters say "tokens"); "auth" only as a name: authorization, or before a
   quote or a backslash. */
#define TOKEN 0
static const struct {
    const char *text;
    unsigned adds;
} literals[] = {
    {"token", NAMED},
    {"secret", NAMED},
    {"pass", NAMED},
    {"key", NAMED},
    {"authorization", NAMED},
    {"auth\"", NAMED},
    {"auth'", NAMED},
    {"auth\\", NAMED},
    {"credential", NAMED},
    {"cookie", NAMED},
    {"://", SCHEME},
    {"xox", XOX},
    {"gh", GH},
    {"eyj", EYJ},
    {"sk-", HIT},
    {"-----begin", HIT},
    {"github_pat_", HIT},
    {"bearer", HIT},
    {"akia", HIT},
    {"asia", HIT},
    {"aiza", HIT},
};
#define LITERALS (sizeof(literals) / sizeof(literals[0]))
_Static_assert(LITERALS <= 32, "a pair's literals are the bits of an unsigned");

/* What one ASCII character adds, and which literals start with each pair of them (a bit each). */
static unsigned short single[128];
static unsigned starts[128][128];
static Py_ssize_t lengths[LITERALS];

static void
init_tables(void)
{
    single['='] = KEYED;
    single[':'] = KEYED;
    single['@'] = AT;
    single['-'] = DASH;
    single['_'] = UNDERSCORE;
    single['.'] = DOT;
    for (unsigned k = 0; k < LITERALS; k++) {
        const unsigned char *text = (const unsigned char *)literals[k].text;
        lengths[k] = (Py_ssize_t)strlen(literals[k].text);
        starts[text[0]][text[1]] |= 1u << k;
    }
}

/* Whether the text at i starts with literal k. */
static inline __attribute__((always_inline)) int
has(int kind, const void *data, Py_ssize_t n, Py_ssize_t i, unsigned k)
{
    Py_ssize_t m = lengths[k];
    if (n - i < m)
        return 0;
    for (Py_ssize_t j = 2; j < m; j++) /* the first two are the pair that led here */
        if (PyUnicode_READ(kind, data, i + j) != (Py_UCS4)(unsigned char)literals[k].text[j])
            return 0;
    return 1;
}

static inline __attribute__((always_inline)) int
scan(int kind, const void *data, Py_ssize_t n)
{
    unsigned seen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c >= 128) {
            /* The letters a case-blind match takes for ASCII ones (shapes._odd_case). */
            if (c == 0x131 || c == 0x17f || c == 0x307)
                return 1;
            continue;
        }
        seen |= single[c];
        Py_UCS4 d = i + 1 < n ? PyUnicode_READ(kind, data, i + 1) : 0; /* no pair starts "c\0" */
        if (d >= 128)
            continue;
        for (unsigned mask = starts[c][d]; mask; mask &= mask - 1) {
            unsigned k = (unsigned)__builtin_ctz(mask);
            if (!has(kind, data, n, i, k))
                continue;
            if (k == TOKEN && i + lengths[k] < n &&
                PyUnicode_READ(kind, data, i + lengths[k]) == 's')
                continue;
            seen |= literals[k].adds;
        }
        if (seen & HIT)
            return 1;
    }
    return ((seen & KEYED) && ((seen & NAMED) || ((seen & AT) && (seen & SCHEME)))) ||
           ((seen & DASH) && (seen & XOX)) || ((seen & UNDERSCORE) && (seen & GH)) ||
           ((seen & DOT) && (seen & EYJ));
}

/* One copy of scan() for each width of a str's characters. */
static int
scan_1(const void *data, Py_ssize_t n)
{
    return scan(PyUnicode_1BYTE_KIND, data, n);
}

static int
scan_2(const void *data, Py_ssize_t n)
{
    return scan(PyUnicode_2BYTE_KIND, data, n);
}

static int
scan_4(const void *data, Py_ssize_t n)
{
    return scan(PyUnicode_4BYTE_KIND, data, n);
}

static PyObject *
screen(PyObject *Py_UNUSED(module), PyObject *low)
{
    if (!PyUnicode_Check(low)) {
        PyErr_Format(PyExc_TypeError, "screen() takes a str, not %.100s", Py_TYPE(low)->tp_name);
        return NULL;
    }
#if PY_VERSION_HEX < 0x030C0000
    if (PyUnicode_READY(low) < 0)
        return NULL;
#endif
    const void *data = PyUnicode_DATA(low);
    Py_ssize_t n = PyUnicode_GET_LENGTH(low);
    int hit;
    switch (PyUnicode_KIND(low)) {
    case PyUnicode_1BYTE_KIND:
        hit = scan_1(data, n);
        break;
    case PyUnicode_2BYTE_KIND:
        hit = scan_2(data, n);
        break;
    default:
        hit = scan_4(data, n);
        break;
    }
    return PyBool_FromLong(hit);
}

static PyMethodDef methods[] = {
    {"screen", screen, METH_O,
     "screen($module, low, /)\n--\n\nWhether the lowercased text may hold a credential shape "
     "(shapes.screen_chain, in one pass)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "codelegate.translator._screen", NULL, 0, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__screen(void)
{
    init_tables();
    return PyModule_Create(&module);
}
