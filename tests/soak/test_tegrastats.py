"""The tegrastats parser on lines written from NVIDIA's documented format (JetPack 4/5/6 forms)."""

from __future__ import annotations

import pytest

from veo_edge.soak.tegrastats import parse_line

MiB = 1 << 20

# JetPack 6 (Orin): timestamp, mW units, per-cluster GR3D frequencies, absent sensors at -256C
ORIN = (
    "12-01-2026 08:00:01 RAM 2448/7620MB (lfb 3x4MB) SWAP 12/3810MB (cached 0MB) "
    "CPU [2%@1190,4%@1190,0%@1190,6%@1190,off,off] EMC_FREQ 3%@2133 GR3D_FREQ 41%@[305,305] "
    "VIC_FREQ 729 APE 174 CV0@-256C CPU@44.5C SOC2@42.031C SOC0@42.5C CV1@-256C GPU@42.093C "
    "tj@44.5C SOC1@42.156C CV2@-256C VDD_IN 4123mW/4100mW VDD_CPU_GPU_CV 491mW/480mW VDD_SOC 1226mW/1220mW"
)
# JetPack 4 (Xavier/Nano): no timestamp, IRAM, plain numbers for the rails
XAVIER = (
    "RAM 1559/3964MB (lfb 467x4MB) SWAP 0/1982MB (cached 0MB) IRAM 0/252kB(lfb 252kB) "
    "CPU [12%@102,5%@102,off,off] EMC_FREQ 0% GR3D_FREQ 0% PLL@25C CPU@27.5C PMIC@100C "
    "GPU@26C AO@34C thermal@26.75C POM_5V_IN 1208/1208 POM_5V_GPU 0/0 POM_5V_CPU 161/161"
)


def test_orin_line():
    s = parse_line(ORIN)
    assert s["ram_used"] == 2448 * MiB and s["ram_total"] == 7620 * MiB
    assert s["swap_used"] == 12 * MiB and s["swap_total"] == 3810 * MiB
    assert s["lfb_blocks"] == 3 and s["lfb_block_bytes"] == 4 * MiB
    assert s["cpu_online"] == 4 and s["cpu_percent"] == pytest.approx(3.0)
    assert s["emc_percent"] == 3 and s["gpu_percent"] == 41
    assert s["temp_cpu_c"] == 44.5 and s["temp_gpu_c"] == pytest.approx(42.093) and s["temp_tj_c"] == 44.5
    assert "temp_cv0_c" not in s  # -256C: no sensor
    assert s["power_vdd_in_mw"] == 4123 and s["power_vdd_in_avg_mw"] == 4100
    assert s["power_vdd_cpu_gpu_cv_mw"] == 491


def test_xavier_line_without_units_or_timestamp():
    s = parse_line(XAVIER)
    assert s["ram_used"] == 1559 * MiB and s["lfb_blocks"] == 467
    assert s["cpu_online"] == 2 and s["cpu_percent"] == pytest.approx(8.5)
    assert s["gpu_percent"] == 0 and s["emc_percent"] == 0
    assert s["temp_gpu_c"] == 26 and s["temp_thermal_c"] == 26.75
    assert s["power_pom_5v_in_mw"] == 1208 and s["power_pom_5v_gpu_mw"] == 0


def test_lines_without_numbers_parse_to_nothing():
    assert parse_line("") == {}
    assert parse_line("tegrastats: interval set to 1000 ms") == {}
