// variants3.cu's copy kernels and two flatter ones (1 and 2 loads a thread: smaller chunks,
// more blocks), for run4.py's question: which geometry copies 64 KiB to 16 MiB fastest.
#include "variants3.cu"

FLAT(1) FLAT(2)
