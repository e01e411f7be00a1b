{{/*
The objects' name. Fixed, not the release's: a node has one CNI, and the
manifest's objects (and the docs' commands) are called ebpf-cni.
*/}}
{{- define "ebpf-cni.name" -}}ebpf-cni{{- end -}}

{{/* The labels of every object, and the DaemonSet's selector. */}}
{{- define "ebpf-cni.labels" -}}
app.kubernetes.io/name: {{ include "ebpf-cni.name" . }}
{{- end -}}

{{- define "ebpf-cni.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end -}}
{{- end -}}

{{/* "true" when a value is set: not null, not "" (false and 0 are set). */}}
{{- define "ebpf-cni.isSet" -}}
{{- if and (not (kindIs "invalid" .)) (ne (toString .) "") -}}true{{- end -}}
{{- end -}}

{{/*
The agent's metricsAddr for the ConfigMap: "" (not written) for the
agent's default, ":9967"; "off" with metrics disabled.
*/}}
{{- define "ebpf-cni.metricsAddr" -}}
{{- if not .Values.metrics.enabled -}}
off
{{- else if ne (int .Values.metrics.port) 9967 -}}
:{{ int .Values.metrics.port }}
{{- end -}}
{{- end -}}

{{/* Whether the metrics Service is rendered: asked for, or the ServiceMonitor's. */}}
{{- define "ebpf-cni.metricsService" -}}
{{- if and .Values.metrics.enabled (or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled) -}}true{{- end -}}
{{- end -}}

{{/*
What the schema cannot say (values.schema.json has the types): refused at
install rather than in an init container's log on every node.
*/}}
{{- define "ebpf-cni.validate" -}}
{{- $c := .Values.config -}}
{{- if and (ne $c.mode "vxlan") (or (include "ebpf-cni.isSet" $c.vxlanPort) (include "ebpf-cni.isSet" $c.vxlanVNI)) -}}
{{- fail "config.vxlanPort and config.vxlanVNI are for config.mode vxlan only" -}}
{{- end -}}
{{- if and (eq $c.mode "vxlan") (not $c.clusterCIDRs) -}}
{{- fail "config.mode vxlan needs config.clusterCIDRs: the ranges the overlay carries" -}}
{{- end -}}
{{- if and (not .Values.metrics.enabled) (or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled) -}}
{{- fail "metrics.service and metrics.serviceMonitor need metrics.enabled" -}}
{{- end -}}
{{- end -}}
