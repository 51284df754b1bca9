{{- define "joinservice.name" -}}gatehouse-joinservice{{- end -}}
{{- define "joinservice.labels" -}}
app.kubernetes.io/name: {{ include "joinservice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "joinservice.selector" -}}
app.kubernetes.io/name: {{ include "joinservice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* files/alerts.yaml with its double-bracketed names filled in from .Values.monitoring. */}}
{{- define "joinservice.alertRules" -}}
{{- $m := .Values.monitoring -}}
{{- $rules := .Files.Get "files/alerts.yaml" -}}
{{- $rules = replace "[[ job ]]" $m.job $rules -}}
{{- $rules = replace "[[ runbookURL ]]" $m.runbookURL $rules -}}
{{- range $k, $v := $m.alerts }}{{ $rules = replace (printf "[[ %s ]]" $k) (toString $v) $rules }}{{ end -}}
{{- with regexFind "\\[\\[ [A-Za-z]+ \\]\\]" $rules }}{{ fail (printf "files/alerts.yaml uses %s, which monitoring.alerts does not set" .) }}{{ end -}}
{{- $rules -}}
{{- end -}}

{{- /* The image by digest when image.digest is set (a release's charts: docs/install.md), else by tag (`gatehouse mini`'s local images). */ -}}
{{- define "joinservice.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}{{- else -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}
{{- end -}}
