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

{{/*
The API server's address for in-cluster clients (apiServer.host, .port), first in the
container's env as config/components/api-server puts it; nothing without apiServer.host.
*/}}
{{- define "nodeipam.apiServerEnv" -}}
{{- with .Values.apiServer.host -}}
- name: KUBERNETES_SERVICE_HOST
  value: {{ . | quote }}
- name: KUBERNETES_SERVICE_PORT
  value: {{ $.Values.apiServer.port | quote }}
{{- end }}
{{- end }}

{{/*
The pod's dnsPolicy: with the API server's address, the node's resolver (cluster DNS is a
Service, which may not work yet); on the host network otherwise, cluster DNS still.
*/}}
{{- define "nodeipam.dnsPolicy" -}}
{{- if .Values.apiServer.host -}}
Default
{{- else if .Values.hostNetwork -}}
ClusterFirstWithHostNet
{{- end -}}
{{- end }}

{{/*
Rules across values (values.schema.json checks each value alone). The release namespace's
pod-security level is read from the cluster when there is one (not by `helm template`): the
host network needs `privileged`, and a Deployment whose pods are refused installs "fine"
and never runs.
*/}}
{{- define "nodeipam.validate" -}}
{{- if and (not .Values.metrics.enabled) (or .Values.metrics.service.enabled .Values.metrics.serviceMonitor.enabled) -}}
{{- fail "metrics.service and metrics.serviceMonitor need metrics.enabled" -}}
{{- end -}}
{{- if and (not .Values.hostNetwork) (has (trimAll "[]" (toString .Values.probes.host)) (list "127.0.0.1" "::1" "localhost")) -}}
{{- fail "probes.host is loopback but hostNetwork is false: the kubelet cannot reach the pod's loopback; set probes.host to \"\" (every interface)" -}}
{{- end -}}
{{- if .Values.apiServer.host -}}
{{- range .Values.extraEnv -}}
{{- if has .name (list "KUBERNETES_SERVICE_HOST" "KUBERNETES_SERVICE_PORT") -}}
{{- fail (printf "extraEnv sets %s and so does apiServer.host: give the API server's address once, in apiServer" .name) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.hostNetwork -}}
{{- $ns := lookup "v1" "Namespace" "" .Release.Namespace -}}
{{- $level := "" -}}
{{- if $ns -}}
{{- $level = index ($ns.metadata.labels | default dict) "pod-security.kubernetes.io/enforce" | default "" -}}
{{- end -}}
{{- if has $level (list "baseline" "restricted") -}}
{{- fail (printf "namespace %s enforces pod-security.kubernetes.io/enforce=%s, which refuses the host network (hostNetwork=true): label it pod-security.kubernetes.io/enforce=privileged" .Release.Namespace $level) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/*
The pods' topologySpreadConstraints: each of topologySpreadConstraints, with the controller
pods' labels as labelSelector when it names none.
*/}}
{{- define "nodeipam.topologySpreadConstraints" -}}
{{- range .Values.topologySpreadConstraints }}
{{- $c := deepCopy . }}
{{- if not (hasKey $c "labelSelector") }}
{{- $_ := set $c "labelSelector" (dict "matchLabels" (include "nodeipam.selectorLabels" $ | fromYaml)) }}
{{- end }}
- {{ toYaml $c | nindent 2 | trim }}
{{- end }}
{{- end }}
