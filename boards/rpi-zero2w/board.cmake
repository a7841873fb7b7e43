# Raspberry Pi Zero 2 W (RP3A0 (BCM2710A1), 4x Cortex-A53, 1 GHz), 64-bit Raspberry Pi OS bookworm. Read by boards/CMakeLists.txt;
# the CPU flags must equal the preset's EDGETRAIN_AARCH64_CPU_FLAGS (checked at configure time).
set(EDGETRAIN_BOARD_NAME "Raspberry Pi Zero 2 W")
set(EDGETRAIN_BOARD_CPU_FLAGS "-mcpu=cortex-a53")
# Compute threads of the worker (XNNPACK's thread pool).
set(EDGETRAIN_BOARD_THREADS 2)
# The worker's memory budget: systemd MemoryMax= of its unit (the board has 512 MB).
set(EDGETRAIN_BOARD_MEMORY_MAX 128M)
