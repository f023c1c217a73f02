print("upload-relay")
