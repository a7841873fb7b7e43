# Raspberry Pi 4 Model B (BCM2711, 4x Cortex-A72, 1.5-1.8 GHz), 64-bit Raspberry Pi OS bookworm. Read by boards/CMakeLists.txt;
# the CPU flags must equal the preset's EDGETRAIN_AARCH64_CPU_FLAGS (checked at configure time).
set(EDGETRAIN_BOARD_NAME "Raspberry Pi 4 Model B")
set(EDGETRAIN_BOARD_CPU_FLAGS "-mcpu=cortex-a72")
# Compute threads of the worker (XNNPACK's thread pool).
set(EDGETRAIN_BOARD_THREADS 4)
# The worker's memory budget: systemd MemoryMax= of its unit (the board has 1-8 GB).
set(EDGETRAIN_BOARD_MEMORY_MAX 512M)
