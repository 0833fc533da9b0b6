"""Post-training quantization: parameters, plans, calibration, QDQ insertion and analysis."""
