# Raspberry Pi 5 (BCM2712, 4x Cortex-A76, 2.4 GHz), 64-bit Raspberry Pi OS bookworm. Read by boards/CMakeLists.txt;
# the CPU flags must equal the preset's EDGETRAIN_AARCH64_CPU_FLAGS (checked at configure time).
set(EDGETRAIN_BOARD_NAME "Raspberry Pi 5")
set(EDGETRAIN_BOARD_CPU_FLAGS "-mcpu=cortex-a76")
# Compute threads of the worker (XNNPACK's thread pool).
set(EDGETRAIN_BOARD_THREADS 4)
# The worker's memory budget: systemd MemoryMax= of its unit (the board has 2-16 GB).
set(EDGETRAIN_BOARD_MEMORY_MAX 512M)
