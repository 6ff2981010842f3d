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

{{- define "nodeipam.validate" -}}
{{- if not (has .Values.certMode (list "managed" "cert-manager")) -}}
{{- fail (printf "certMode must be managed or cert-manager, not %q" .Values.certMode) -}}
{{- end -}}
{{- end }}
