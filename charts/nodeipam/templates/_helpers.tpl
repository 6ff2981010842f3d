{{/*
Labels. The selector labels are those of config/ (app.kubernetes.io/name and component);
the rest are Helm's usual ones.
*/}}
{{- define "nodeipam.labels" -}}
app.kubernetes.io/name: nodeipam
app.kubernetes.io/part-of: nodeipam
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "nodeipam.selectorLabels" -}}
app.kubernetes.io/name: nodeipam
app.kubernetes.io/component: controller
{{- end }}

{{- define "nodeipam.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/* The Service's DNS names, for the cert-manager Certificate. */}}
{{- define "nodeipam.webhookDNSNames" -}}
- nodeipam-webhook.{{ .Release.Namespace }}.svc
- nodeipam-webhook.{{ .Release.Namespace }}.svc.cluster.local
{{- end }}

{{/*
host:port for a --*-bind-address flag: an empty host is every interface (":8085"), an IPv6
host gets brackets ("[::1]:8086").
*/}}
{{- define "nodeipam.bindAddress" -}}
{{- $host := toString .host -}}
{{- if contains ":" $host -}}
[{{ trimAll "[]" $host }}]:{{ .port }}
{{- else -}}
{{ $host }}:{{ .port }}
{{- end -}}
{{- end }}

{{/* Whether /metrics is served over HTTPS to authorized callers only. */}}
{{- define "nodeipam.metricsSecure" -}}
{{- if and .Values.metrics.enabled .Values.metrics.secure -}}true{{- end -}}
{{- end }}

{{- define "nodeipam.validate" -}}
{{- if not (has .Values.certMode (list "managed" "cert-manager")) -}}
{{- fail (printf "certMode must be managed or cert-manager, not %q" .Values.certMode) -}}
{{- end -}}
{{- if and (not .Values.metrics.enabled) (or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled) -}}
{{- fail "metrics.service and metrics.serviceMonitor need metrics.enabled" -}}
{{- end -}}
{{- if and (not .Values.hostNetwork) (has (trimAll "[]" (toString .Values.probes.host)) (list "127.0.0.1" "::1" "localhost")) -}}
{{- fail "probes.host is loopback but hostNetwork is false: the kubelet cannot reach the pod's loopback; set probes.host to \"\" (every interface)" -}}
{{- end -}}
{{- end }}
