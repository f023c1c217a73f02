print("upload-agent")
