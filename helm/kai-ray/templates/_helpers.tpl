{{- define "kai-ray.name" -}}{{ .Release.Name }}-kai-ray{{- end -}}
{{- define "kai-ray.labels" -}}
app.kubernetes.io/name: kai-ray
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end -}}
