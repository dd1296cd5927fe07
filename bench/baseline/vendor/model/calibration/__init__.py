"""Online calibration: window observations, residuals, the least-squares fit and the tuner."""
