package config

// Register the JSON log format before the logging flags are added, as
// upstream kube-proxy does, so that --logging-format=json works.
import _ "k8s.io/component-base/logs/json/register"
