{{/* The name of every namespaced object of the release. */}}
{{- define "kai-ray.fullname" -}}
{{- if contains "kai-ray" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-kai-ray" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two releases never collide. */}}
{{- define "kai-ray.clusterName" -}}
{{- printf "%s-%s" (include "kai-ray.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kai-ray.selectorLabels" -}}
app.kubernetes.io/name: kai-ray
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kai-ray.labels" -}}
{{ include "kai-ray.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kai-ray.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "kai-ray.webhookServiceName" -}}
{{- printf "%s-webhook" (include "kai-ray.fullname" .) -}}
{{- end -}}

{{/* The webhook configuration kopf keeps up to date; the chart owns its lifecycle. */}}
{{- define "kai-ray.webhookConfigName" -}}
{{- printf "%s.kai-ray.io" (include "kai-ray.clusterName" .) -}}
{{- end -}}

{{/*
The webhook's serving certificate, as the Secret's data: the one in the
cluster while it is for this Service and has more than renewBeforeDays left,
else a new CA and certificate (so `helm upgrade` rotates it in time).
*/}}
{{- define "kai-ray.webhookCertificate" -}}
{{- $name := printf "%s-webhook-cert" (include "kai-ray.fullname" .) -}}
{{- $service := include "kai-ray.webhookServiceName" . -}}
{{- $dns := printf "%s.%s.svc" $service .Release.Namespace -}}
{{- $cert := .Values.webhook.certificate -}}
{{- $existing := lookup "v1" "Secret" .Release.Namespace $name -}}
{{- $annotations := dict -}}
{{- if $existing -}}{{- $annotations = $existing.metadata.annotations | default dict -}}{{- end -}}
{{- $expires := index $annotations "kai-ray.io/certificate-expires" | default "" -}}
{{- $renewBy := now | dateModify (printf "+%dh" (mul (int $cert.renewBeforeDays) 24)) | unixEpoch -}}
{{- if and $expires (eq (index $annotations "kai-ray.io/certificate-for" | default "") $dns) (gt (toDate "2006-01-02T15:04:05Z07:00" $expires | unixEpoch | int64) ($renewBy | int64)) -}}
expires: {{ $expires }}
ca.crt: {{ index $existing.data "ca.crt" }}
tls.crt: {{ index $existing.data "tls.crt" }}
tls.key: {{ index $existing.data "tls.key" }}
{{- else -}}
{{- $days := int $cert.validityDays -}}
{{- $ca := genCA "kai-ray webhook CA" $days -}}
{{- $names := list $service (printf "%s.%s" $service .Release.Namespace) $dns (printf "%s.cluster.local" $dns) -}}
{{- $serving := genSignedCert $dns nil $names $days $ca -}}
expires: {{ now | dateModify (printf "+%dh" (mul $days 24)) | date "2006-01-02T15:04:05Z07:00" }}
ca.crt: {{ $ca.Cert | b64enc }}
tls.crt: {{ $serving.Cert | b64enc }}
tls.key: {{ $serving.Key | b64enc }}
{{- end -}}
{{- end -}}
