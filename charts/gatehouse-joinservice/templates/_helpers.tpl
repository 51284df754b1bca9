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
{{- /* The image by digest when image.digest is set (a release's charts: docs/install.md), else by tag (`gatehouse mini`'s local images). */ -}}
{{- define "joinservice.image" -}}
{{- if .Values.image.digest -}}{{ .Values.image.repository }}@{{ .Values.image.digest }}{{- else -}}{{ .Values.image.repository }}:{{ .Values.image.tag }}{{- end -}}
{{- end -}}
