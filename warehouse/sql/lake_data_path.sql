-- where the attached lake keeps its data files
SELECT value FROM ducklake_options('lake') WHERE option_name = 'data_path'
