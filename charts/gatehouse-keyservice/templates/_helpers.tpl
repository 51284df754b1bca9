{{- define "keyservice.name" -}}gatehouse-keyservice{{- end -}}
{{- define "keyservice.labels" -}}
app.kubernetes.io/name: {{ include "keyservice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ .Chart.Name }}-{{ .Chart.Version }}
{{- end -}}
{{- define "keyservice.selector" -}}
app.kubernetes.io/name: {{ include "keyservice.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}
