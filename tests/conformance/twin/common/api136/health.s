// Empty: its presence lets health.go declare getHealthInfo without a body (a link name).
